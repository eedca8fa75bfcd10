"""The cost model of a fused step, in units of one target decode step, and where its numbers came from.

    one fused step at k   = verify(k) + k * c
    verify(k)             = 1 + b * (k - 1)
    speedup(k)            = tokens / (steps(k) * (verify(k) + k * c))

c is t_draft / t_target, b the verify slope. `source` says where both came from, in words a reader of
the advice can check (validate.step_costs makes them: this artifact's programs, recorded device step
times, a stated bytes-read model, or transformers forwards on this host).
"""

from __future__ import annotations

from dataclasses import dataclass

from fusedspec.compile.documents.validation import CostModelRecord
from fusedspec.core.errors import ConfigError
from fusedspec.validate.acceptance import KStats

FORMULA = "speedup(k) = tokens / (steps(k) * (1 + b*(k-1) + k*c))"


@dataclass(frozen=True)
class CostModel:
    cost_ratio: float  # c = t_draft / t_target
    verify_slope: float = 0.0  # b
    # where c and b came from, e.g. "measured on this artifact's programs (median of 9, ...)"
    source: str = "given"

    def __post_init__(self) -> None:
        if not self.cost_ratio > 0:
            raise ConfigError(f"cost ratio {self.cost_ratio} must be positive (t_draft / t_target)")
        if self.verify_slope < 0:
            raise ConfigError(f"verify slope {self.verify_slope} must not be negative")

    def step_cost(self, k: int) -> float:
        """One fused step at k, in target decode steps."""
        return 1.0 + self.verify_slope * (k - 1) + k * self.cost_ratio

    def speedup(self, stats: KStats) -> float | None:
        if not stats.steps:
            return None
        return stats.tokens / (stats.steps * self.step_cost(stats.k))

    def describe(self) -> str:
        return f"c = {self.cost_ratio:.3f}, b = {self.verify_slope:.3f}: {self.source}"

    def record(self) -> CostModelRecord:
        return CostModelRecord(cost_ratio=self.cost_ratio, verify_slope=self.verify_slope, source=self.source,
                               formula=FORMULA)
