"""`fusedspec serve` on loopback: throughput and inter-token latency against concurrency, fused against the
target alone, time to ready, and the 60 s load run of must-show 3.

    nice -n 10 .venv/bin/python bench/serve_load.py [--point-seconds 10] [--load-seconds 60] [--k 3]
        [--draft perturbed|copy] [--skip-table] [--skip-load]

The tiny pair (the tests' 2-layer Qwen3 target and its "perturbed" draft, which next to never agrees with it;
or the "copy" draft, which always does), built once into the work dir as a batch-4, seq 128, float32 cpu
artifact with the target-alone programs, published to a directory store.

Table: two servers of that one version side by side, `fusedspec serve` and `fusedspec serve --target-alone`
(queue 16: no 429 at these concurrencies). For c = 1, 2, 4: c closed-loop clients (tests/support/
load_clients.py, the real openai client, answers alternately whole and streamed) for --point-seconds
against the fused server, then against the target alone, so a busy host skews both alike. tokens/s counts
correct answers' tokens; ITL is the median over streamed tokens of a chunk's gap / its tokens. Every answer
is checked against transformers' greedy output of the target.

Load: one fused server with --queue-size 2, 8 clients for --load-seconds: correct answers, 429s, errors,
VmRSS of the server (first quarter vs end); then kill -9 while 8 clients stream, and a restart.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compile.build import build_artifact  # noqa: E402
from compile.settings import Settings, load_settings  # noqa: E402
from compile.spec import BuildSpec  # noqa: E402
from flows.demo.models import derive_draft, make_tiny_qwen3, qwen3_tokenizer_dir  # noqa: E402
from registry.hub import resolve_model  # noqa: E402
from registry.publish import publish_artifact  # noqa: E402
from tests.fixtures.cpu_artifacts import PROMPT_TEXTS  # noqa: E402
from tests.fixtures.servers import free_port, stop_process  # noqa: E402
from tests.fixtures.serving import FUSEDSPEC, ServeProcess, serve_env  # noqa: E402
from tests.support.load_clients import Case, LoadReport, client_for, run_load, stream_until_cut  # noqa: E402

NEW_TOKENS = 32
CONCURRENCY = (1, 2, 4)


def tiny_artifact(settings: Settings, k: int, draft_name: str) -> tuple[Path, Path]:
    """(artifact, target dir): the tests' tiny target and one of its drafts, batch 4, with target-alone programs.
    "perturbed" (noise on every weight) almost never agrees with the target: speculation's lower bound;
    "copy" (the target itself) always does: its upper bound, k tokens a step."""
    root = settings.work_dir / "test-fixtures"
    tokenizer = qwen3_tokenizer_dir(root)
    target = make_tiny_qwen3(root / "tiny-target", tokenizer, seed=1)
    if draft_name == "copy":
        draft = root / "tiny-draft-copy"
        if not (draft / "model.safetensors").is_file():
            shutil.rmtree(draft, ignore_errors=True)
            shutil.copytree(target, draft)
    else:
        draft = derive_draft(target, root / "tiny-draft-perturbed", noise=0.3, seed=3)
    spec = BuildSpec(1, 128, k, 4, "float32", "cpu")
    artifact = build_artifact(spec, resolve_model(str(target), settings), resolve_model(str(draft), settings),
                              settings, options={"aot_inductor": False, "target_alone": True})
    return artifact, target


def greedy_cases(artifact: Path, target: Path) -> list[Case]:
    """Transformers' greedy tokens of the target alone (as the tests' hf_greedy fixture computes them)."""
    import torch
    from transformers import AutoModelForCausalLM

    from validate.prompts import load_tokenizer

    tokenizer = load_tokenizer(artifact)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    cases = []
    for text in PROMPT_TEXTS:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=151643)
        cases.append(Case(text, NEW_TOKENS, tuple(out[0, ids.shape[1]:].tolist())))
    return cases


def start(version: str, log: Path, *extra: str) -> tuple[ServeProcess, float]:
    port = free_port()
    server = ServeProcess([FUSEDSPEC, "serve", version, "--port", str(port), *extra], serve_env(), log, port)
    return server, server.wait_ready()


def check(report: LoadReport, what: str) -> None:
    if report.errors or report.wrong:
        raise SystemExit(f"{what}: {len(report.errors)} errors, {len(report.wrong)} wrong answers: "
                         f"{(report.errors + report.wrong)[:3]}")


def table(version: str, cases: list[Case], logs: Path, seconds: float, k: int) -> None:
    fused, fused_ready = start(version, logs / "fused.log", "--queue-size", "16")
    alone, alone_ready = start(version, logs / "alone.log", "--queue-size", "16", "--target-alone")
    try:
        model = client_for(fused.url).models.list().data[0].id
        rows = []
        for clients in CONCURRENCY:
            measured = {}
            for name, server in (("fused", fused), ("target", alone)):
                report = run_load(server.url, model, cases, clients=clients, seconds=seconds)
                check(report, f"{name} at c={clients}")
                measured[name] = report
            rows.append((clients, measured["fused"], measured["target"]))
        per_step = tokens_per_step(fused.url)
    finally:
        stop_process(fused.proc)
        stop_process(alone.proc)
    print(f"\nfused: {per_step:.2f} tokens per request per step over the whole table (k={k})")
    print(f"\ntime to ready (verify, load, warm-up, listen): fused {fused_ready:.1f} s, target alone "
          f"{alone_ready:.1f} s, ratio {fused_ready / alone_ready:.2f}")
    print("\n| c | fused tok/s | target tok/s | ratio | fused ITL ms | target ITL ms | ITL ratio | answers f/t |")
    print("|---|---|---|---|---|---|---|---|")
    for clients, f, t in rows:
        print(f"| {clients} | {f.tokens_per_s:.0f} | {t.tokens_per_s:.0f} | {f.tokens_per_s / t.tokens_per_s:.2f} | "
              f"{f.median_itl_ms():.1f} | {t.median_itl_ms():.1f} | {f.median_itl_ms() / t.median_itl_ms():.2f} | "
              f"{f.completed}/{t.completed} |")


def tokens_per_step(url: str) -> float:
    """Mean tokens a fused step gave a request, from the server's own /metrics histogram."""
    import httpx

    values = {}
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith(("fusedspec_tokens_per_step_sum ", "fusedspec_tokens_per_step_count ")):
            name, value = line.split(" ")
            values[name.rsplit("_", 1)[1]] = float(value)
    return values["sum"] / values["count"]


def load(version: str, cases: list[Case], logs: Path, seconds: float) -> None:
    server, ready = start(version, logs / "load.log", "--queue-size", "2")
    rss: list[int] = []
    try:
        model = client_for(server.url).models.list().data[0].id
        report = run_load(server.url, model, cases, clients=8, seconds=seconds,
                          on_tick=lambda: rss.append(server.rss_kib()))
        settled = rss[len(rss) // 4:]
        print(f"\nload: 8 clients, {report.seconds:.0f} s, ready after {ready:.1f} s: {report.completed} correct "
              f"answers, {len(report.wrong)} wrong, {len(report.errors)} errors, {report.rejected} answered 429 "
              f"(Retry-After {sorted(report.retry_after)}), {report.tokens_per_s:.0f} tokens/s, median ITL "
              f"{report.median_itl_ms():.1f} ms; VmRSS {settled[0] / 1024:.0f} MiB after the first quarter, "
              f"{rss[-1] / 1024:.0f} MiB at the end (range {(max(settled) - min(settled)) / 1024:.1f} MiB, "
              f"median {statistics.median(settled) / 1024:.0f} MiB)")
        check(report, "load")
        endings = stream_until_cut(server.url, model, Case(cases[0].prompt, 90, ()), cut=server.kill, clients=8,
                                   run_s=2.0, timeout=10)
        print(f"kill -9 with 8 clients streaming: {sorted(endings)}")
        restarted, again = start(version, logs / "restart.log", "--queue-size", "2")
        after = run_load(restarted.url, model, cases, clients=8, seconds=5)
        stop_process(restarted.proc)
        print(f"restarted: ready after {again:.1f} s, {after.completed} correct answers in 5 s, "
              f"{len(after.errors)} errors, {len(after.wrong)} wrong")
        check(after, "after the restart")
    finally:
        stop_process(server.proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--point-seconds", type=float, default=10.0)
    parser.add_argument("--load-seconds", type=float, default=60.0)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--draft", choices=("perturbed", "copy"), default="perturbed",
                        help="perturbed: speculation's lower bound (next to no acceptance); copy: its upper bound")
    parser.add_argument("--skip-table", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    args = parser.parse_args()
    settings = load_settings()
    artifact, target = tiny_artifact(settings, args.k, args.draft)
    runs = settings.work_dir / "bench-serve" / time.strftime("%Y%m%dT%H%M%S")
    version = publish_artifact(artifact, str(runs / "store"), settings, unvalidated=True).version_uri
    cases = greedy_cases(artifact, target)
    print(f"artifact {artifact.name[:12]} (tiny target, {args.draft} draft, tp1 seq128 k{args.k} batch4 float32), "
          f"{NEW_TOKENS} new tokens "
          f"per request, {len(cases)} prompts")
    if not args.skip_table:
        table(version, cases, runs, args.point_seconds, args.k)
    if not args.skip_load:
        load(version, cases, runs, args.load_seconds)


if __name__ == "__main__":
    main()
