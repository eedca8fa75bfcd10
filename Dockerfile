# The fusedspec images. One name per base, used the same way by prefect.yaml, deploy/ and `fusedspec k8s`:
#
#   docker build -t fusedspec:neuron .                    # Neuron DLC base (default): compiles with NxDI and
#                                                         # serves with the vLLM fork (`fusedspec k8s` pods)
#   docker build --build-arg BASE=cpu -t fusedspec:cpu .  # python:3.11-slim + the cpu extra (reference backend)
#
# The Neuron base is AWS's vLLM Deep Learning Container of Neuron SDK 2.26.1, the stack that serves draft-model
# fused speculation: the legacy vLLM fork (aws-neuron/upstreaming-to-vllm, branch 2.26.1), NxDI 0.6.10598,
# Python 3.11 (aws-neuron/deep-learning-containers vllm/inference/0.9.1/Dockerfile.neuronx at 14b1f0d).
# Compile pods and serving pods run this one image, so an artifact is served by the toolchain that compiled it
# and the serving pod's `fusedspec verify --runtime-check` compares exactly vLLM's toolchain.
# Override NEURON_IMAGE to move SDKs (and recompile: keys change).
# The default command starts a Prefect worker on FUSEDSPEC_WORK_POOL; Prefect's Kubernetes worker replaces
# the command of its job pods, `fusedspec k8s` pods run `fusedspec verify` then `vllm` (neuron) or
# `fusedspec serve` (cpu), and
# `docker run IMAGE fusedspec ...` runs the CLI.

ARG BASE=neuron
ARG NEURON_IMAGE=public.ecr.aws/neuron/pytorch-inference-vllm-neuronx:0.9.1-neuronx-py311-sdk2.26.1-ubuntu22.04
ARG CPU_IMAGE=python:3.11-slim

# ---- the project as a wheel (no dependencies resolved here) ---------------------------------------------
FROM ${CPU_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core ./core
COPY compile ./compile
COPY validate ./validate
COPY registry ./registry
COPY demo ./demo
COPY serve ./serve
COPY flows ./flows
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# ---- base per backend -------------------------------------------------------------------------------------
# Neuron: torch, torch-neuronx, neuronx-cc, NxDI and transformers come with the DLC; only our own
# dependencies are added, none of which pins those.
FROM ${NEURON_IMAGE} AS base-neuron
ENV FUSEDSPEC_EXTRAS="" \
    PIP_EXTRA_INDEX_URL=""

# CPU: the cpu extra pins torch; the PyTorch CPU index keeps pip from pulling the multi-GB CUDA build.
FROM ${CPU_IMAGE} AS base-cpu
ENV FUSEDSPEC_EXTRAS="[cpu]" \
    PIP_EXTRA_INDEX_URL="https://download.pytorch.org/whl/cpu"
# AOTInductor, the cpu default packaging, compiles its programs with g++ on the worker (plan refuses a
# default config without one). The compiler is whatever the base image's Debian release ships.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*

# ---- the worker ----------------------------------------------------------------------------------------------
# base-${BASE} is one of the two stages above, not a registry image: nothing to tag.
# hadolint ignore=DL3006
FROM base-${BASE} AS worker
# Must equal pyproject.toml's version (tests/test_dockerfile.py checks it).
ARG FUSEDSPEC_VERSION=0.1.0
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=wheel /wheels/ /tmp/wheels/
RUN python3 -m pip install --no-cache-dir --find-links /tmp/wheels \
        "fusedspec${FUSEDSPEC_EXTRAS}==${FUSEDSPEC_VERSION}" \
    && rm -rf /tmp/wheels \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin fusedspec \
    && mkdir -p /work/tmp && chown -R fusedspec /work

# Every cache and scratch directory (models, builds, NxDI's BASE_COMPILE_WORK_DIR, Hugging Face, Prefect)
# lives under the work dir: mount a large volume there on a compile node.
ENV FUSEDSPEC_WORK_DIR=/work \
    HF_HOME=/work/hf-home \
    PREFECT_HOME=/work/prefect-home \
    MPLCONFIGDIR=/work/mpl \
    TMPDIR=/work/tmp \
    FUSEDSPEC_WORK_POOL=trn2 \
    PYTHONUNBUFFERED=1
WORKDIR /work
USER 10001
# The DLC's entrypoint runs its arguments as a child process (common/vllm_entrypoint.py), which would keep
# signals from the worker; commands run directly instead, on both bases.
ENTRYPOINT []
CMD ["bash", "-c", "mkdir -p \"$TMPDIR\" && exec prefect worker start --pool \"$FUSEDSPEC_WORK_POOL\""]
