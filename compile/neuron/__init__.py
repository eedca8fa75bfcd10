"""The `neuron` backend: NxDI fused speculation on Trainium.

    options.py     the run config's `neuron` section (platform, LNC, bucketing, buckets, async_mode) and
                   NxDI's rules for it, per build
    heads.py       NxDI's attention-head arithmetic at a TP degree (GQA split, replication, MHA fallback)
    fields.py      the NeuronConfig field names NxDI accepts: stored per release, or read from the installed
                   NxDI; the version gate
    translate.py   BuildSpec + both model configs + options -> the complete NxDI configuration, as plain
                   data (pure)
    steps.py       per-step acceptance accounting for the generation adapter's output (pure)
    toolchain.py   versions of the Neuron toolchain on this host; comparing a recorded one against it
    device.py      the only module that imports Neuron packages (lazily): compile, load, generate
    backend.py     BACKEND: compile.backend.Backend + dry_run + runtime_mismatches

Everything but device.py imports and is tested on any machine; device.py needs the Neuron SDK.
"""
