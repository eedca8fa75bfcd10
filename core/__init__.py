"""What every other package stands on: the error hierarchy and exit codes (errors.py), the one reader of
the environment (settings.py), file plumbing: atomic writes, locks, hashing (files.py), the schemes a
reference may use (schemes.py) and a lock around transformers' lazy imports (transformers_names.py).

Nothing here imports another fusedspec package.
"""
