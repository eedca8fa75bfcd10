"""What every other package stands on: the error hierarchy and exit codes (errors.py), the one reader of
the environment (settings.py), file plumbing: atomic writes, locks, hashing (files.py), the schemes a
reference may use (schemes.py), a lock around transformers' lazy imports (transformers_names.py) and values
kept by the sha256 of the bytes they were made from (kept.py).

Nothing here imports another fusedspec package.
"""
