"""Build specs, matrices, content keys and the compile backends (`cpu` reference, `neuron` = NxDI).

Nothing here imports `flows`, `validate` or `registry`: imports flow one way, toward this package.
"""
