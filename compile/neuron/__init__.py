"""The `neuron` backend: NxDI fused speculation on Trainium.

    fields.py      the NeuronConfig field names NxDI accepts, per supported NxDI/SDK version, and the check
    translate.py   BuildSpec + both model configs -> the complete NxDI configuration, as plain data (pure)
    steps.py       per-step acceptance accounting for the generation adapter's output (pure)
    toolchain.py   versions of the Neuron toolchain on this host; comparing a recorded one against it
    device.py      the only module that imports Neuron packages (lazily): compile, load, generate
    backend.py     BACKEND: compile.backend.Backend + dry_run + runtime_mismatches

Everything but device.py imports and is tested on any machine; device.py needs the Neuron SDK.
"""
