"""Time to ready of `fusedspec serve`, before and after trust on load (issue 25), side by side.

    nice -n 5 .venv/bin/python bench/trust_on_load.py --pair real --models-dir DIR \
        --baseline-python /work/main/.venv/bin/python [--packaging aoti] [--runs 3] [--artifact DIR]

One build of the pair (bench/startup.py's pair and build; --artifact reuses one) is published, signed, to
a directory store under the work dir, once by each side's own `fusedspec publish`: the code before reads
only the manifests it writes, and only the build.json it knew (`as_known_by`: the same files, hard-linked,
build.json without the fields added since). Then, in fresh processes that alternate over --runs rounds, the
seconds from starting `fusedspec serve VERSION` until /ready answers 200, each side with its own code:

  before, full    the code before (--baseline-python: a venv with that checkout installed, e.g. main's):
                  `verify` re-hashes every byte, then the load reads every byte again
  before, quick   the same with --quick, the pod's path then: sizes only, nothing hashed (no integrity)
  after           this tree: manifest, signature and listing, then the load hashes every byte as it reads it

The page cache holds the files after the first round (no root to drop it), so these are warm starts: the
disk read is left out and what remains is hashing, loading, imports and the warm-up. Medians are printed
with each side's ratio to `after`; nothing is asserted. The pair and the packaging are printed with the
figures. The vLLM pod's init step on a multi-GB Neuron layout is bench/init_check.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.startup import build, pair_models  # noqa: E402
from fusedspec.compile.program_cache import link_or_copy  # noqa: E402
from fusedspec.core.settings import Settings, load_settings  # noqa: E402
from fusedspec.registry.publish import publish_artifact  # noqa: E402
from fusedspec.registry.signing import generate_keys  # noqa: E402
from tests.fixtures.servers import free_port, stop_process  # noqa: E402

READY_TIMEOUT_S = 1800.0


def tail(log: Path, lines: int = 40) -> str:
    """The end of the servers' log, for the message: the scratch directory holding it is removed on exit."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def time_to_ready(python: str, version: str, quick: bool, env: dict[str, str], log: Path) -> float:
    """Seconds from spawning `fusedspec serve` with `python` until /ready answers 200 (then it is stopped)."""
    port = free_port()
    command = ([python, "-m", "fusedspec.flows.cli", "serve", version, "--port", str(port)]
               + (["--quick"] if quick else []))
    started = time.perf_counter()
    with open(log, "ab") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
    try:
        while time.perf_counter() - started < READY_TIMEOUT_S:
            if process.poll() is not None:
                raise SystemExit(f"{' '.join(command)} exited with {process.returncode}:\n{tail(log)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return time.perf_counter() - started
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.1)
        raise SystemExit(f"{' '.join(command)} was not ready within {READY_TIMEOUT_S:.0f} s:\n{tail(log)}")
    finally:
        stop_process(process)


def as_known_by(python: str, artifact: Path, out: Path) -> Path:
    """`artifact` as the fusedspec of `python` reads one: the same files (hard links where it can) and a
    build.json holding only the fields that code knows (graph_key, weight_key, programs and programs_from
    came after 87a5719, and build.json refuses unknown fields)."""
    known = subprocess.run([python, "-c", "import json; from fusedspec.compile.documents.build import "
                            "BuildDescription; print(json.dumps(sorted(BuildDescription.model_fields)))"],
                           capture_output=True, text=True, check=True)
    fields = set(json.loads(known.stdout))
    shutil.copytree(artifact, out, copy_function=lambda src, dst: link_or_copy(Path(src), Path(dst)),
                    ignore=shutil.ignore_patterns("build.json"))
    described = json.loads((artifact / "build.json").read_text())
    (out / "build.json").write_text(json.dumps({k: v for k, v in described.items() if k in fields}, indent=2))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="tiny", choices=("tiny", "0.5b", "real"))
    parser.add_argument("--models-dir", type=Path, default=None,
                        help="converted Qwen2.5-Coder directories (default: the work dir's real-models)")
    parser.add_argument("--packaging", default="aoti", choices=("aoti", "export"))
    parser.add_argument("--artifact", type=Path, help="an existing build to publish instead of building one")
    parser.add_argument("--baseline-python", default="/work/main/.venv/bin/python",
                        help="a Python whose fusedspec is the code before (default: main's worktree venv)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    settings = load_settings()
    scratch = Path(tempfile.mkdtemp(prefix="bench-trust-", dir=settings.work_dir))
    try:
        work = Settings(work_dir=scratch / "work")
        if args.artifact is not None:
            artifact, name = args.artifact, str(args.artifact)
        else:
            name, target, draft, spec = pair_models(args.pair, settings,
                                                    args.models_dir or settings.work_dir / "real-models")
            artifact, seconds = build(target, draft, spec, args.packaging == "aoti", work)
            print(f"built {name} ({args.packaging}) in {seconds:.0f} s", file=sys.stderr, flush=True)
        signing, verify = generate_keys()
        size = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
        env = {**os.environ, "FUSEDSPEC_WORK_DIR": str(work.work_dir), "FUSEDSPEC_VERIFY_KEY": verify,
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        after_version = publish_artifact(artifact, str(scratch / "store-after"),
                                         Settings(work_dir=work.work_dir, signing_key=signing),
                                         unvalidated=True).version_uri
        before_artifact = as_known_by(args.baseline_python, artifact, scratch / "artifact-before")
        done = subprocess.run([args.baseline_python, "-m", "fusedspec.flows.cli", "publish",
                               str(before_artifact), str(scratch / "store-before"), "--unvalidated",
                              "--json"],
                              env={**env, "FUSEDSPEC_SIGNING_KEY": signing}, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"the code before could not publish the artifact: {done.stderr[-2000:]}")
        before_version = str(next((scratch / "store-before").rglob("manifest.json")).parent)
        sides = {"before, full": (args.baseline_python, before_version, False),
                 "before, quick": (args.baseline_python, before_version, True),
                 "after": (sys.executable, after_version, False)}
        seconds: dict[str, list[float]] = {side: [] for side in sides}
        for run in range(args.runs):
            for side, (python, version, quick) in sides.items():
                seconds[side].append(time_to_ready(python, version, quick, env, scratch / "serve.log"))
                print(f"run {run + 1} {side}: {seconds[side][-1]:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    after = statistics.median(seconds["after"])
    print(f"\n{name}, {args.packaging}, {size / 2**30:.2f} GiB in the version; median of {args.runs} warm "
          "starts (spawn to /ready 200)\n")
    print("| serve start | what is checked | time to ready s | / after |")
    print("|---|---|---|---|")
    checked = {"before, full": "every byte hashed by verify, then read again by the load",
               "before, quick": "sizes only (the pod path before)",
              "after": "every byte hashed as the load reads it"}
    for side, values in seconds.items():
        median = statistics.median(values)
        print(f"| {side} | {checked[side]} | {median:.1f} ({', '.join(f'{v:.1f}' for v in values)}) | "
              f"{median / after:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
