"""Build specs, matrices, content keys, the typed documents between stages, and the compile backends
(`cpu` reference, `neuron` = NxDI).

Imports only `core`: imports flow one way, toward these two packages.
"""
