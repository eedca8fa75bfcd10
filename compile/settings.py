"""The one place that reads the environment.

Everything else receives a `Settings` (or a value from it). Secrets are kept here and never printed:
`Settings.__repr__` masks them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


def _default_work_dir() -> Path:
    return Path.cwd() / ".work"


@dataclass(frozen=True)
class Settings:
    work_dir: Path
    hf_endpoint: str | None = None
    hf_token: str | None = field(default=None, repr=False)
    s3_endpoint_url: str | None = None
    aws_region: str | None = None
    neuron_cc_flags: str | None = None
    # Test seam, never set in production: "greedy:<config slug>" makes that build's artifact wrong
    # before validation, so end-to-end tests can show a failing gate is caught and not published.
    test_fault: str | None = None

    @property
    def models_dir(self) -> Path:
        return self.work_dir / "models"

    @property
    def builds_dir(self) -> Path:
        return self.work_dir / "builds"

    @property
    def cache_dir(self) -> Path:
        return self.work_dir / "cache"

    @property
    def tmp_dir(self) -> Path:
        return self.work_dir / "tmp"


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    work = Path(env.get("FUSEDSPEC_WORK_DIR") or _default_work_dir()).resolve()
    return Settings(
        work_dir=work,
        hf_endpoint=env.get("HF_ENDPOINT") or None,
        hf_token=env.get("HF_TOKEN") or None,
        s3_endpoint_url=env.get("FUSEDSPEC_S3_ENDPOINT_URL") or env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL") or None,
        aws_region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
        neuron_cc_flags=env.get("NEURON_CC_FLAGS") or None,
        test_fault=env.get("FUSEDSPEC_TEST_FAULT") or None,
    )
