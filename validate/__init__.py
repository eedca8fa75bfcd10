"""Tokenizer equivalence, greedy equivalence, acceptance statistics and k advice."""
