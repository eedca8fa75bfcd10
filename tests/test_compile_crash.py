"""A `fusedspec compile` killed with SIGKILL leaves its `.partial` staging directory; the next compile of that
key removes it, and `fusedspec gc --work-dir` removes one of another key (issue 11, must show 4). Two compiles
of one key at once compile it once, and the one that waited says so. One process at a time validates a build.

The compiles are real (cpu backend, the tiny Qwen3 pair) and run in child processes killed with SIGKILL
once their staging directory holds a file: nothing in them gets to clean up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fusedspec.flows.cli import main

pytestmark = pytest.mark.slow  # real compiles in child processes: about a minute here


def _staging(work: Path, key: str) -> list[Path]:
    builds = work / "builds"
    return sorted(builds.glob(f".{key}.*.partial")) if builds.is_dir() else []


def _killed_compile(run: Path, key: str, work: Path) -> Path:
    """Start `fusedspec compile RUN --key KEY` and SIGKILL it once its staging dir holds a file."""
    env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(work)}
    child = subprocess.Popen([sys.executable, "-m", "fusedspec.flows.cli", "compile", str(run), "--key", key],
                             env=env, cwd=Path(__file__).parents[1], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while not any(p.is_file() for s in _staging(work, key) for p in s.rglob("*")):
            if child.poll() is not None:
                raise AssertionError(f"compile exited {child.returncode} first: "
                                     f"{child.stderr.read().decode()[-2000:]}")
            assert time.monotonic() < deadline, "the compile never wrote into a staging dir"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
    [staging] = _staging(work, key)
    return staging


def test_a_killed_compile_leaves_no_staging_after_a_rerun_and_gc_removes_another_keys(
        tiny_target: Path, tiny_drafts: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(work))
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({
        "target": str(tiny_target), "draft": str(tiny_drafts["cut"]), "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [3, 4], "batch_size": [1],
                   "dtype": ["float32"]}, "compile": {"aot_inductor": False}}))
    assert main(["plan", str(run), "--json"]) == 0
    first, second = (build["key"] for build in json.loads(capsys.readouterr().out)["builds"])

    killed = _killed_compile(run, first, work)
    assert main(["compile", str(run), "--key", first, "--json"]) == 0  # the same build again
    [built] = json.loads(capsys.readouterr().out)["builds"]
    assert not built["reused"] and Path(built["artifact"]).name == first
    assert _staging(work, first) == [] and not killed.exists()

    other = _killed_compile(run, second, work)
    assert main(["gc", "--work-dir", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["work_dir"]
    assert report["staging"] == [str(other)] and not other.exists()
    assert (work / "builds" / first / "build.json").is_file()  # the finished build is not staging


def test_gc_work_dir_leaves_a_build_that_validate_is_using(
        build_tiny, cpu_settings, capsys, tmp_path: Path,  # noqa: ANN001
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`gc --work-dir` removed a published build while `fusedspec validate` was running on it."""
    from fusedspec.compile.workdir import mark_published

    build = build_tiny(tp=1, k=2, batch=1, draft="cut")  # test_cpu_export's: compiled once per session
    mark_published(build, "s3://somewhere/else")  # evictable: the store has it (undone at the end)
    child = _validate_in_use(build, cpu_settings, tmp_path)
    monkeypatch.setenv("FUSEDSPEC_WORK_DIR", str(cpu_settings.work_dir))
    for dry in (["--dry-run"], []):
        assert main(["gc", "--work-dir", "--all-published", "--json", *dry]) == 0
        assert json.loads(capsys.readouterr().out)["work_dir"]["builds"] == []
    _, err = child.communicate(timeout=300)
    assert child.returncode == 0, err.decode()[-2000:]
    assert (build / "build.json").is_file() and (build / "validation.json").is_file()
    # no longer in use: evictable
    assert main(["gc", "--work-dir", "--all-published", "--json", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["work_dir"]["builds"] == [str(build)]
    (build / "validation.json").unlink()  # the shared build as it was
    (build / ".published").unlink()


def test_two_compiles_of_one_key_at_once_compile_it_once_and_say_so(tiny_target: Path,
                                                                    tiny_drafts: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    """Two `fusedspec compile` processes of one config on one work dir: one compiles, the other waits on the
    build's lock and reports the build as reused, not as a compile it did not make."""
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({
        "target": str(tiny_target), "draft": str(tiny_drafts["cut"]), "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [64], "speculation_length": [2], "batch_size": [1],
                   "dtype": ["float32"]}, "compile": {"aot_inductor": False}}))
    env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(tmp_path / "work")}
    children = [subprocess.Popen([sys.executable, "-m", "fusedspec.flows.cli", "compile", str(run), "--json"],
                                 env=env, cwd=Path(__file__).parents[1], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
                for _ in range(2)]
    reports = []
    for child in children:
        out, err = child.communicate(timeout=600)
        assert child.returncode == 0, err[-2000:]
        reports.append(json.loads(out)["builds"][0])
    assert sorted(r["work"] for r in reports) == ["built", "compile"], reports
    assert len({r["artifact"] for r in reports}) == 1
    assert [r["reused"] for r in reports if r["work"] == "built"] == [True]


def test_one_process_at_a_time_validates_and_publishes_a_build(build_tiny, cpu_settings,  # noqa: ANN001
                                                                tmp_path: Path) -> None:
    """Two runs on one work dir validated a build at once: the second rewrote validation.json under the
    first's publish, which refused the changed file. `fusedspec validate` waits while another process holds
    the build's validation (as a run does from its gate to its publish), then writes it."""
    import psutil

    from fusedspec.compile.workdir import validating

    build = build_tiny(tp=1, k=2, batch=1, draft="cut")  # test_cpu_export's: compiled once per session
    (build / "validation.json").unlink(missing_ok=True)
    with validating(cpu_settings, build):
        child = _validate_in_use(build, cpu_settings, tmp_path)  # then it asks for the build's validation
        # Waiting for a lock is polling it, not computing: a validation would load programs and run them.
        before = sum(psutil.Process(child.pid).cpu_times()[:2])
        time.sleep(3)
        spent = sum(psutil.Process(child.pid).cpu_times()[:2]) - before
        assert child.poll() is None and spent < 0.5, f"validate did not wait ({spent:.2f} s of CPU in 3 s)"
        assert not (build / "validation.json").exists()
    _, err = child.communicate(timeout=300)
    assert child.returncode == 0, err.decode()[-2000:]
    assert (build / "validation.json").is_file()
    (build / "validation.json").unlink()  # the shared build as it was


def _validate_in_use(build: Path, settings, tmp_path: Path) -> subprocess.Popen:  # noqa: ANN001
    """`fusedspec validate` of `build` (one short prompt) in a child process, returned once it holds the build
    in use (a shared hold of its build lock, which validation takes first)."""
    from fusedspec.compile.build import build_lock
    from fusedspec.core.files import lock_if_free

    prompts = tmp_path / "one.jsonl"
    prompts.write_text(json.dumps({"class": "code", "text": "def fibonacci(n):"}) + "\n")
    child = subprocess.Popen([sys.executable, "-m", "fusedspec.flows.cli", "validate", str(build),
                              "--no-advice", "--max-new-tokens", "4", "--variants", "raw", "--prompts",
                              str(prompts)], env={**os.environ, "FUSEDSPEC_WORK_DIR": str(settings.work_dir)},
                             cwd=Path(__file__).parents[1], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while True:
        with lock_if_free(build_lock(settings, build.name)) as free:
            if not free:
                return child
        assert child.poll() is None, child.communicate()[1].decode()[-2000:]
        assert time.monotonic() < deadline, "validate never began"
        time.sleep(0.05)
