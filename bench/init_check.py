"""What the serving pod's init step costs at each start: the quick check against the full re-hash (issue 13).

    nice -n 10 .venv/bin/python bench/init_check.py [--gib 3] [--repeats 3]

A Neuron-shaped artifact of Qwen3-32B + 1.7B at TP 32 (tests/fixtures/fake_artifacts.make_neuron_artifact:
the backend's own layout and build.json, 32 weight shards holding --gib GiB in total) is published to a
SeaweedFS server started here (loopback, data under the work dir, stopped by PID at the end). Then, each
--repeats times, median reported:
  - S3, quick:   verify_version(version, quick=True): the manifest, one listing and a HEAD per file (the
                 server-computed checksum), no weight read;
  - S3, full:    verify_version(version): every object read back and hashed (what the init container did);
  - mount, quick / full: the init container's command line before issue 25, `fusedspec verify <dir>
    --runtime-check --quick --json` (and without --quick), as a fresh process, on the version copied to a
    directory named by its key, as the pod mounts it (quick: sizes only, so a same-size overwrite passed);
  - S3 + mount, quick / full: its command line now (`fusedspec k8s`), `fusedspec verify s3://... --mount
    <dir> --runtime-check --quick --json`: the store's listing and a HEAD per file for the server-computed
    checksum, plus the mount's manifest and sizes (full: every object read back from S3 and hashed).
    This host has no Neuron SDK, so the runtime check reports mismatches (exit 1); its cost is included.
    The page cache holds the copy (no root to drop it), so the mount's full figure is a lower bound for
    Mountpoint, which reads from S3.

Prints one table with seconds and the full/quick ratio; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fusedspec.core.settings import load_settings  # noqa: E402
from fusedspec.demo.models import qwen3_tokenizer_dir  # noqa: E402
from fusedspec.registry.publish import publish_artifact  # noqa: E402
from fusedspec.registry.stores import open_store  # noqa: E402
from fusedspec.registry.verify import verify_version  # noqa: E402
from tests.fixtures.fake_artifacts import make_neuron_artifact  # noqa: E402
from tests.fixtures.seaweed import SeaweedServer  # noqa: E402

TP = 32


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def init_command(target: str, quick: bool, mount: Path | None = None) -> Callable[[], object]:
    command = [sys.executable, "-m", "fusedspec.flows.cli", "verify", target, "--runtime-check", "--json"]
    command += ["--quick"] if quick else []
    command += ["--mount", str(mount)] if mount is not None else []

    def run() -> None:
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
        if done.returncode not in (0, 1) or '"problems"' not in done.stdout:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr[-500:]}")
        # Only runtime mismatches (no Neuron SDK here) may be reported: the files themselves must match.
        if '"runtime: ' not in done.stdout and done.returncode == 1:
            raise RuntimeError(f"the init check found file problems: {done.stdout[-800:]}")

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gib", type=float, default=3.0, help="weights in the artifact, GiB (default 3)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    settings = load_settings()
    root = settings.work_dir / "bench-init-check"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    server = SeaweedServer(root / "seaweed")
    server.start()
    try:
        os.environ.update(server.env())
        s3 = server.settings(settings.work_dir)
        bucket = server.new_bucket()
        shard_bytes = int(args.gib * 2**30 / TP)
        started = time.perf_counter()
        artifact = make_neuron_artifact(root / "artifact",
                                        qwen3_tokenizer_dir(settings.work_dir / "test-fixtures"),
                                        tp=TP, k=7, batch=4, seq_len=1024, shard_bytes=shard_bytes)
        made = time.perf_counter() - started
        started = time.perf_counter()
        result = publish_artifact(artifact, f"s3://{bucket}/fusedspec", s3)
        published = time.perf_counter() - started
        total = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
        files = sum(1 for p in artifact.rglob("*") if p.is_file())
        print(f"artifact: {files} files, {total / 2**30:.2f} GiB (made in {made:.1f} s, published to "
              f"SeaweedFS in {published:.1f} s)")

        store = open_store(result.version_uri, s3)
        mount = root / "mount" / result.key  # named by the key, as `fusedspec k8s` mounts it
        for info in store.list(""):
            path = mount / info.key
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as out:
                for chunk in store.iter_bytes(info.key):
                    out.write(chunk)

        def s3_check(quick: bool) -> Callable[[], object]:
            def run() -> None:
                report = verify_version(result.version_uri, s3, quick=quick)
                if not report.ok:
                    raise RuntimeError(report.problems)
            return run

        rows = [
            ("S3 (SeaweedFS), in process", median_seconds(s3_check(True), args.repeats),
             median_seconds(s3_check(False), args.repeats)),
            ("mount dir, init command before", median_seconds(init_command(str(mount), True), args.repeats),
             median_seconds(init_command(str(mount), False), args.repeats)),
            ("S3 + mount, init command now", median_seconds(init_command(result.version_uri, True, mount),
                                                            args.repeats),
             median_seconds(init_command(result.version_uri, False, mount), args.repeats)),
        ]
        print(f"\nmedian of {args.repeats} runs, {total / 2**30:.2f} GiB in {files} files")
        print(f"{'where':34} {'quick s':>9} {'full s':>9} {'full/quick':>11}")
        for where, quick_s, full_s in rows:
            print(f"{where:34} {quick_s:9.2f} {full_s:9.2f} {full_s / quick_s:10.1f}x")
        per_gib = rows[0][2] / (total / 2**30)
        print(f"\nfull re-hash from S3: {per_gib:.1f} s/GiB here; at that rate the 65 GB of Qwen3-32B at TP "
              f"32 would take about {per_gib * 65e9 / 2**30 / 60:.0f} min per pod start; the quick check "
              f"reads the manifest, one listing and {files} HEADs, whatever the weights weigh")
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
