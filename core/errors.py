"""Every error fusedspec raises on purpose, and the exit code each one means.

    FusedspecError                      base; `exit_code` says how the CLI ends
    ├── InputError(ValueError)          bad input or usage: exit 2, nothing written
    │   ├── ModelRefError               a model reference that cannot be resolved or used
    │   │   └── HubUnavailable*         the Hub answered 429/5xx, or the connection failed or timed out
    │   ├── ConfigError                 a run config or BuildSpec that is malformed
    │   ├── MatrixError                 a matrix with impossible builds (carries every problem)
    │   ├── CheckpointError             a checkpoint whose files or tensors do not fit its config
    │   ├── PromptError                 an empty, malformed or too long prompt set
    │   ├── ArtifactError               an artifact directory that is incomplete or not ours
    │   ├── StoreError                  a store URI, endpoint or credential that does not work
    │   │   └── StoreUnavailable*       S3 kept failing transiently (5xx, throttling, resets) past its retries
    │   └── DiskFullError               the disk (or quota) under a directory we write to is full
    ├── CompileError                    a backend's output failed its own soundness check: exit 1
    ├── UnreadableObject                an object the store lists but cannot return (damaged there): exit 1
    └── CheckFailed                     a check ran and failed: exit 1
        ├── TokenizerMismatchError      target and draft do not encode identically
        ├── GreedyMismatchError         speculation changed the greedy output
        └── VerificationError           a published version differs from its manifest

Input errors subclass ValueError so callers that do not know fusedspec still catch them sensibly.
* also a TransientError: a service that may answer on a later try; a flow retries the build (and only
  for these), a CLI command ends with its message as for the parent class.
"""

from __future__ import annotations

from typing import Any


class FusedspecError(Exception):
    exit_code = 1


class InputError(FusedspecError, ValueError):
    exit_code = 2


class ModelRefError(InputError):
    pass


class ConfigError(InputError):
    pass


class TransientError(FusedspecError):
    """A service (the Hub, S3) did not answer, or answered 429/5xx: another try later may succeed."""


class HubUnavailable(ModelRefError, TransientError):
    pass


class MatrixError(InputError):
    """All problems of a matrix (or a whole run config) at once, so a user fixes them in one pass."""

    def __init__(self, problems: list[str], what: str = "the build matrix"):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s) in {what}:\n{lines}")


class CheckpointError(InputError):
    pass


class PromptError(InputError):
    pass


class ArtifactError(InputError):
    pass


class StoreError(InputError):
    pass


class StoreUnavailable(StoreError, TransientError):
    pass


class DiskFullError(InputError):
    """No space left while writing; names the directory, what was written and the room it needed."""


class CompileError(FusedspecError):
    """The toolchain produced a program we will not save (nothing is written); not the user's input."""


class UnreadableObject(FusedspecError):
    """The store lists the object (and answers for others) but cannot return its bytes: a fault of the store,
    not of the input. Names the object (`where`) and what the store did (`reason`)."""

    def __init__(self, where: str, reason: str):
        self.where, self.reason = where, reason
        super().__init__(f"{where}: the store cannot return it ({reason}): the object is damaged in the "
                         "store. Delete it (or its version) and publish the artifact again: the version is "
                         "then seen as damaged and replaced")


class CheckFailed(FusedspecError):
    exit_code = 1

    def __init__(self, message: str, report: Any = None):
        super().__init__(message)
        self.report = report


class TokenizerMismatchError(CheckFailed):
    pass


class GreedyMismatchError(CheckFailed):
    pass


class VerificationError(CheckFailed):
    pass
