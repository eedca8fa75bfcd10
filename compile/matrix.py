"""Expand a run config's matrix into BuildSpecs and check every one against both models' configs.

All problems are collected and raised together (MatrixError) before any weight download or compile.
Each problem is reported once, naming the value at fault, not once per combination it appears in.
"""

from __future__ import annotations

import itertools

from fusedspec.compile.modelconfig import ModelArch
from fusedspec.compile.runconfig import MatrixConfig
from fusedspec.compile.spec import MAX_BUILDS, BuildSpec, spec_problems
from fusedspec.core.errors import MatrixError

BACKEND_MODEL_TYPES = ("qwen3", "qwen2", "llama")


# Backends whose TP rule is their own: NxDI falls back to converting GQA to MHA for a TP that fits neither
# head count (compile.neuron.heads), so no TP is refused for its heads; the neuron backend's check names
# the fallback and what it costs.
OWN_TP_RULE = ("neuron",)


def tp_problem(arch: ModelArch, tp: int, role: str, backend: str) -> str | None:
    """The cpu backend's sharding (compile.cpu.sharding): Q heads are padded to a multiple of TP, KV heads
    are split when TP divides them and replicated when they divide TP. Anything else cannot be sharded."""
    kv = arch.num_key_value_heads
    if backend in OWN_TP_RULE or kv % tp == 0 or tp % kv == 0:
        return None
    return (
        f"tp_degree={tp} does not fit the {role}'s {kv} KV heads: TP must divide them or be a multiple "
        f"of them (try {', '.join(str(t) for t in _fitting_tps(kv))})"
    )


def _fitting_tps(kv: int) -> list[int]:
    return [t for t in (1, 2, 4, 8, 16, 32, 64) if kv % t == 0 or t % kv == 0][:6]


def arch_problems(arch: ModelArch, role: str, backend: str) -> list[str]:
    if arch.model_type not in BACKEND_MODEL_TYPES:
        return [f"the {role}'s model_type {arch.model_type!r} is not supported by the {backend} backend "
                f"(supported: {', '.join(BACKEND_MODEL_TYPES)})"]
    return []


def build_problems(spec: BuildSpec, target: ModelArch, draft: ModelArch) -> list[str]:
    """What every backend refuses for one spec and these models (backends add their own rules)."""
    problems: list[str] = []
    for role, arch in (("target", target), ("draft", draft)):
        problems += arch_problems(arch, role, spec.backend)
        problem = tp_problem(arch, spec.tp_degree, role, spec.backend)
        if problem:
            problems.append(problem)
        if spec.seq_len > arch.max_position_embeddings:
            problems.append(f"seq_len={spec.seq_len} exceeds the {role}'s "
                            f"max_position_embeddings={arch.max_position_embeddings}")
    return problems


def combinations(matrix: MatrixConfig, backend: str) -> list[dict[str, object]]:
    """Every build of the matrix as BuildSpec fields, in a fixed order."""
    return [{"tp_degree": tp, "seq_len": seq, "speculation_length": k, "batch_size": bs, "dtype": dtype,
             "backend": backend}
            for tp, seq, k, bs, dtype in itertools.product(matrix.tp_degree, matrix.seq_len,
                                                           matrix.speculation_length, matrix.batch_size,
                                                           matrix.dtype)]


def size_problem(matrix: MatrixConfig) -> str | None:
    """A matrix of more builds than one run plans (a rule across the lists, which JSON Schema cannot say)."""
    if matrix.size() > MAX_BUILDS:
        return f"matrix: {matrix.size()} builds; one run plans at most {MAX_BUILDS} (each is a compile)"
    return None


def spec_only_problems(matrix: MatrixConfig, backend: str) -> list[str]:
    """The matrix's problems that need no model (reported when a model could not be read)."""
    too_many = size_problem(matrix)
    if too_many:
        return [too_many]
    problems: list[str] = []
    for fields in combinations(matrix, backend):
        problems += [p for p in spec_problems(**fields) if p not in problems]
    return problems


def model_problems(tps: list[int], seq_lens: list[int], backend: str, target: ModelArch,
                   draft: ModelArch) -> list[str]:
    """What the two models refuse of the matrix's values, each problem once (also of a matrix whose other
    values break the schema: every mistake is reported at once)."""
    problems: list[str] = []
    for role, arch in (("target", target), ("draft", draft)):
        found = [*arch_problems(arch, role, backend), *(tp_problem(arch, tp, role, backend) for tp in tps),
                 *(f"seq_len={seq} exceeds the {role}'s "
                   f"max_position_embeddings={arch.max_position_embeddings}"
                   for seq in seq_lens if seq > arch.max_position_embeddings)]
        problems += [p for p in found if p and p not in problems]
    return problems


def plan_matrix(matrix: MatrixConfig, backend: str, target: ModelArch, draft: ModelArch) -> list[BuildSpec]:
    """Every BuildSpec of the matrix, or MatrixError with every problem found."""
    problems = model_problems(matrix.tp_degree, matrix.seq_len, backend, target, draft)

    def add(problem: str | None) -> None:
        if problem and problem not in problems:
            problems.append(problem)

    too_many = size_problem(matrix)
    if too_many:
        raise MatrixError([*problems, too_many])
    specs: list[BuildSpec] = []
    for fields in combinations(matrix, backend):
        own = spec_problems(**fields)
        for p in own:
            add(p)
        if not own:
            specs.append(BuildSpec(**fields))
    if problems:
        raise MatrixError(problems)
    return specs
