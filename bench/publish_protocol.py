"""What the issue-11 publish protocol costs next to the previous one, on the same artifacts (issue 11, must
show 9).

    nice -n 10 .venv/bin/python bench/publish_protocol.py [--baseline /work/wt-baseline] [--weight-mib 64]
        [--repeats 5]

The artifacts: a k-sweep (k = 2, 3, 4, 5) of four fake cpu artifacts
(tests/fixtures/fake_artifacts.make_artifact) at TP 2 sharing the same two weight shards of --weight-mib MiB
each, so each k after the first can copy its weights inside the store. Each protocol publishes them, in k
order, to a fresh bucket of one SeaweedFS server started here (loopback, data under the work dir, stopped by
PID), then publishes all four again (the versions are intact: a re-run's check). Each protocol runs in its own
process with a fresh work dir (no hash cache):
  - previous:     the code at --baseline (commit 13cfd91: files under the version, copy source chosen by the
                  sha256 written in object metadata, "already published" as soon as a manifest exists);
  - new:          this tree (an attempt directory per publisher, copies only of objects whose server-computed
                  SHA256 matches, a listing of the version before saying it is intact, sweeps);
  - new, signed:  this tree with FUSEDSPEC_SIGNING_KEY set (Ed25519 manifest signatures).
Bytes are each store's own count of request bodies (botocore before-send), requests a before-send counter.
The order of the three rotates between repeats; medians are printed. Asserts nothing about time.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fusedspec.core.settings import load_settings  # noqa: E402
from fusedspec.registry.signing import generate_keys  # noqa: E402
from tests.fixtures.fake_artifacts import make_artifact  # noqa: E402
from tests.fixtures.seaweed import SeaweedServer  # noqa: E402

KS = (2, 3, 4, 5)
PROTOCOLS = ("previous", "new", "new, signed")

# Runs in a child process against whichever tree PYTHONPATH names; both trees have these names.
WORKER = (r"""
import json, sys, time
from pathlib import Path
from fusedspec.core.settings import load_settings
from fusedspec.registry.publish import publish_artifact
from fusedspec.registry.stores import open_store

uri, artifacts = sys.argv[1], sys.argv[2:]
settings = load_settings()
store = open_store(uri, settings)
requests = [0]
store.client.meta.events.register("before-send.s3", lambda **_: requests.__setitem__(0, requests[0] + 1))
rows = []
for phase in ("publish", "again"):
    for artifact in artifacts:
        sent, asked, started, hashed = store.bytes_sent, requests[0], time.perf_counter(), []
        result = publish_artifact(Path(artifact), uri, settings, store=store,
                                  on_step=lambda name: hashed.append(time.perf_counter()) if """
r"""name == "hashed" else None)
        ended = time.perf_counter()
        rows.append({"phase": phase, "artifact": artifact, "seconds": ended - started, "store_seconds": """
r"""ended - hashed[0],
                     "bytes": store.bytes_sent - sent, "requests": requests[0] - asked, "created": """
r"""result.created,
                     "uploaded": result.files_uploaded, "copied": result.files_copied})
print(json.dumps({"module": __import__("fusedspec.registry.publish").publish.__file__, "rows": rows}))
""")


def run_protocol(name: str, tree: Path, artifacts: list[Path], server: SeaweedServer, signing_key: str,
                 scratch: Path) -> dict[str, Any]:
    bucket = server.new_bucket()
    work = Path(tempfile.mkdtemp(prefix="work-", dir=scratch))
    env = {**os.environ, **server.env(), "PYTHONPATH": str(tree), "FUSEDSPEC_WORK_DIR": str(work)}
    for variable in ("FUSEDSPEC_SIGNING_KEY", "FUSEDSPEC_SIGNING_KEY_FILE"):
        env.pop(variable, None)
    if name == "new, signed":
        env["FUSEDSPEC_SIGNING_KEY"] = signing_key
    try:
        done = subprocess.run([sys.executable, "-c", WORKER, f"s3://{bucket}/fusedspec",
                               *map(str, artifacts)], env=env, cwd=tree, capture_output=True, text=True,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{name}: the publishing process failed:\n{done.stderr[-3000:]}")
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        if not result["module"].startswith(str(tree)):
            raise RuntimeError(f"{name}: imported {result['module']}, not the code under {tree}")
        return result
    finally:
        server.drop_bucket(bucket)  # the volumes go back to the server's fixed pool
        shutil.rmtree(work, ignore_errors=True)


def summarize(rows: list[dict[str, Any]], artifact_bytes: int) -> dict[str, float]:
    first, *siblings = [r for r in rows if r["phase"] == "publish"]
    again = [r for r in rows if r["phase"] == "again"]
    if not all(r["created"] for r in [first, *siblings]) or any(r["created"] or r["bytes"] for r in again):
        raise RuntimeError(f"unexpected outcomes: {rows}")
    sweep_bytes = sum(r["bytes"] for r in [first, *siblings])
    return {
        "first s": first["seconds"], "first s in store": first["store_seconds"],
        "first MiB sent": first["bytes"] / 2**20,
        "sibling s": statistics.mean(r["seconds"] for r in siblings),
        "sibling s in store": statistics.mean(r["store_seconds"] for r in siblings),
        "sibling KiB sent": statistics.mean(r["bytes"] for r in siblings) / 2**10,
        "sibling files copied": statistics.mean(r["copied"] for r in siblings),
        "sweep MiB sent": sweep_bytes / 2**20,
        "dedup saved %": 100 * (1 - sweep_bytes / (len(rows) // 2 * artifact_bytes)),
        "re-publish s": statistics.mean(r["seconds"] for r in again),
        "re-publish s in store": statistics.mean(r["store_seconds"] for r in again),
        "re-publish KiB sent": statistics.mean(r["bytes"] for r in again) / 2**10,
        "re-publish requests": statistics.mean(r["requests"] for r in again),
        "publish requests": statistics.mean(r["requests"] for r in [first, *siblings]),
    }


def signing_microseconds(artifact: Path, keys: tuple[str, str], scratch: Path) -> tuple[float, float]:
    """Median µs to sign one manifest of `artifact`, and to check its signature (1,000 of each)."""
    from dataclasses import replace

    from fusedspec.registry.publish import prepare
    from fusedspec.registry.signing import load_signing_key, load_verify_key, sign, signature_problem

    settings = replace(load_settings(), work_dir=scratch / "sign-work")
    unsigned = prepare(artifact, settings, unvalidated=False).manifest("a20260101T000000-00000000", {},
                                                                      settings)
    private, public = load_signing_key(keys[0]), load_verify_key(keys[1])
    timings: dict[str, list[float]] = {"sign": [], "check": []}
    for _ in range(1000):
        started = time.perf_counter()
        signed = sign(unsigned, private)
        timings["sign"].append(time.perf_counter() - started)
        started = time.perf_counter()
        if signature_problem(signed, public) is not None:
            raise RuntimeError("a manifest signed here does not verify")
        timings["check"].append(time.perf_counter() - started)
    return statistics.median(timings["sign"]) * 1e6, statistics.median(timings["check"]) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, default=Path("/work/wt-baseline"),
                        help="a checkout of the previous protocol (commit 13cfd91), used read-only")
    parser.add_argument("--weight-mib", type=float, default=64.0,
                        help="MiB per weight shard, two shards (default 64)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    trees = {"previous": args.baseline.resolve(), "new": ROOT, "new, signed": ROOT}

    scratch = load_settings().work_dir / "bench-publish-protocol"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    server = SeaweedServer(scratch / "seaweed")
    server.start()
    try:
        artifacts = [make_artifact(scratch / f"artifact-k{k}", k=k, tp=2, weight_mib=args.weight_mib,
                                   weights_seed=0)
                     for k in KS]
        artifact_bytes = sum(p.stat().st_size for p in artifacts[0].rglob("*") if p.is_file())
        keys = generate_keys()
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in PROTOCOLS}
        for repeat in range(args.repeats):
            order = PROTOCOLS[repeat % 3:] + PROTOCOLS[:repeat % 3]
            for name in order:
                started = time.perf_counter()
                result = run_protocol(name, trees[name], artifacts, server, keys[0], scratch)
                runs[name].append(summarize(result["rows"], artifact_bytes))
                print(f"repeat {repeat + 1}, {name}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
        table = {name: {metric: statistics.median(r[metric] for r in results) for metric in results[0]}
                 for name, results in runs.items()}
        sign_us, check_us = signing_microseconds(artifacts[0], keys, scratch)
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)

    print(f"\nk-sweep of {len(KS)} artifacts (TP 2, 2 x {args.weight_mib:g} MiB shared weights, "
          f"{artifact_bytes / 2**20:.1f} MiB each) to SeaweedFS 4.48 on loopback; median of {args.repeats}")
    header = (f"{'':24}" + "".join(f"{name:>13}" for name in PROTOCOLS)
              + f"{'new/prev':>10}{'signed/prev':>12}")
    print(header)
    for metric in table["previous"]:
        values = [table[name][metric] for name in PROTOCOLS]
        ratios = "".join(f"{v / values[0]:>{w}.2f}x" if values[0] else f"{'-':>{w + 1}}"
                         for v, w in ((values[1], 9), (values[2], 11)))
        print(f"{metric:24}" + "".join(f"{v:13.2f}" for v in values) + ratios)
    print("\nsibling: a k after the first (its weights can be copied in the store); re-publish: the same "
          "artifact again over its intact version (the new protocol's listing check; nothing is sent); "
          "'in store': after the artifact was read and hashed (the new protocol remembers file hashes by "
          "size and mtime within a work dir, the previous one hashed every file on every publish)")
    print(f"signing itself, measured apart (1,000 times): {sign_us:.0f} µs to sign a manifest, "
          f"{check_us:.0f} µs to check its signature; the 'new, signed' column differs from 'new' by that "
          "and by noise")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
