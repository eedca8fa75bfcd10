"""`fusedspec serve` on loopback: throughput and inter-token latency against concurrency, fused against the
target alone, time to ready, and the 60 s load run of must-show 3.

    nice -n 10 .venv/bin/python bench/serve_load.py [--point-seconds 10] [--load-seconds 60] [--k 3]
        [--draft perturbed|copy] [--skip-table] [--skip-load]
    .venv/bin/python bench/serve_load.py --pair real --skip-load [--k 4] [--point-seconds 60] [--ready-runs 3]

Pairs:
- `tiny` (default): the tests' 2-layer Qwen3 target and its "perturbed" draft, which next to never agrees
  with it, or the "copy" draft, which always does. Built once into the work dir as a batch-4, seq 128,
  float32 cpu artifact with the target-alone programs, published unvalidated to a directory store.
- `real`: Qwen2.5-Coder-1.5B-Instruct + 0.5B-Instruct (tests.support.pypi_models, converted once under
  the work dir), tp 1, seq 256, batch 4, bfloat16, the default packaging (AOTInductor), with the
  target-alone programs. Built, gated and published by the CLI in child processes, as a user would:
  `fusedspec compile`, `fusedspec validate --variants raw,chat --no-advice` (its coverage and staggered
  check are printed), `fusedspec publish`. The requests are the shipped prompts whose reference has no
  near-tie in its 32 tokens, both variants sent as completions: there the target's greedy answer is the
  only correct one.

Table: the two servers of that one version, `fusedspec serve` and `fusedspec serve --target-alone` (queue
16: no 429 at these concurrencies); tiny: side by side, alternating per concurrency, so a busy host skews
both alike; real: one at a time (two 1.5B servers would crowd 24 GiB). For c = 1, 2, 4: c closed-loop
clients (tests/support/load_clients.py, the real openai client, answers alternately whole and streamed)
for --point-seconds (a point lasts until its last request ends). tokens/s counts correct answers' tokens,
whole and streamed; ITL is a time per output token of the streamed answers: the median over their tokens
of a chunk's gap / its tokens (a fused chunk brings several at once), so it leaves out the stalls that
tokens/s counts. Every answer is checked against transformers' greedy output of the target.

--ready-runs N: before the table, N cold starts of each mode, alternating, one server at a time, and
`fusedspec verify` of the version alone (the part of a start that reads every byte).

Load (tiny): one fused server with --queue-size 2, 8 clients for --load-seconds: correct answers, 429s,
errors, VmRSS of the server (first quarter vs end); then kill -9 while 8 clients stream, and a restart.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fusedspec.compile.build import build_artifact  # noqa: E402
from fusedspec.compile.spec import BuildSpec  # noqa: E402
from fusedspec.core.settings import Settings, load_settings  # noqa: E402
from fusedspec.demo.models import derive_draft, make_tiny_qwen3, qwen3_tokenizer_dir  # noqa: E402
from fusedspec.registry.hub import resolve_model  # noqa: E402
from fusedspec.registry.publish import publish_artifact  # noqa: E402
from tests.fixtures.cpu_artifacts import PROMPT_TEXTS  # noqa: E402
from tests.fixtures.servers import free_port, stop_process  # noqa: E402
from tests.fixtures.serving import FUSEDSPEC, READY_TIMEOUT_S, ServeProcess, serve_env  # noqa: E402
from tests.support.load_clients import (  # noqa: E402
    CLIENT_TIMEOUT_S,
    Case,
    LoadReport,
    client_for,
    run_load,
    stream_until_cut,
)

NEW_TOKENS = 32
CONCURRENCY = (1, 2, 4)
MODES = (("fused", ()), ("target", ("--target-alone",)))
REAL_READY_TIMEOUT_S = 900.0  # verify hashes and loads GiBs of programs
REAL_CLIENT_TIMEOUT_S = 300.0  # a whole answer of 32 tokens from a 1.5B model on 2 cores, 4 lines busy


def tiny_artifact(settings: Settings, k: int, draft_name: str) -> tuple[Path, Path]:
    """(artifact, target dir): the tests' tiny target and one of its drafts, batch 4, with target-alone
    programs. "perturbed" (noise on every weight) almost never agrees with the target: speculation's lower
    bound; "copy" (the target itself) always does: its upper bound, k tokens a step."""
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
                              settings, options={"aot_inductor": False, "target_alone": True}).path
    return artifact, target


def real_artifact(settings: Settings, k: int, work: Path) -> tuple[str, list[Case]]:
    """(published version, cases) of the real pair, built, gated and published with the CLI."""
    from tests.support.pypi_models import real_model_dir

    models = settings.work_dir / "real-models"
    target, draft = real_model_dir("qwen2.5-coder-1.5b", models), real_model_dir("qwen2.5-coder-0.5b", models)
    config = work / "run.yaml"
    config.write_text(json.dumps({  # JSON is YAML
        "target": str(target), "draft": str(draft), "backend": "cpu",
        "matrix": {"tp_degree": [1], "seq_len": [256], "speculation_length": [k], "batch_size": [4],
                   "dtype": ["bfloat16"]},
        "compile": {"aot_inductor": True, "target_alone": True}}))
    started = time.perf_counter()
    [build] = json.loads(cli("compile", str(config), "--json"))["builds"]
    artifact = Path(build["artifact"])
    print(f"compile: {'reused' if build['reused'] else 'built'} {artifact.name[:12]} in "
          f"{time.perf_counter() - started:.0f} s")
    started = time.perf_counter()
    gate = json.loads(cli("validate", str(artifact), "--variants", "raw,chat", "--no-advice", "--json"))
    greedy, staggered = gate["greedy"], gate["staggered"]
    # a failed gate exits in cli()
    print(f"gate ({time.perf_counter() - started:.0f} s): {greedy['summary']}")
    print("tokens compared of generated, per prompt: " + ", ".join(
        f"{p['id']} {p['tokens_compared']}/{p['tokens_generated']}" for p in greedy["prompts"]))
    print(f"staggered: {staggered['summary']}")
    version = json.loads(cli("publish", str(artifact), str(work / "store"), "--json"))["version_uri"]
    return version, untied_cases(artifact, target, settings)


def cli(*args: str) -> str:
    done = subprocess.run([FUSEDSPEC, *args], capture_output=True, text=True, env=serve_env())
    if done.returncode != 0:
        raise SystemExit(f"fusedspec {' '.join(args)}: exit {done.returncode}\n"
                         f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def untied_cases(artifact: Path, target: Path, settings: Settings) -> list[Case]:
    """The shipped prompts (raw and chat text) whose greedy reference (the gate's, from its cache) has no
    near-tie and no EOS in NEW_TOKENS, and whose text a completion request encodes to the same ids."""
    from fusedspec.compile.backend import read_build_description
    from fusedspec.compile.modelconfig import read_arch
    from fusedspec.validate.greedy import default_tolerance
    from fusedspec.validate.prompts import load_prompt_set, load_tokenizer, render_prompts
    from fusedspec.validate.reference import get_reference

    description = read_build_description(artifact)
    tokenizer = load_tokenizer(artifact)
    rendered = render_prompts(load_prompt_set("default"), tokenizer, ("raw", "chat"))
    reference = get_reference(target,
                              {"commit": description.target.commit, "files": description.target.files},
                              rendered, max_new_tokens=NEW_TOKENS, dtype=description.spec.dtype,
                              eos_token_ids=list(read_arch(target).eos_token_id),
                              cache_dir=settings.cache_dir)
    tolerance = default_tolerance(description.spec.dtype)
    cases, ids = [], []
    for prompt, ref in zip(rendered, reference.prompts, strict=True):
        untied = min(ref.margins) > tolerance and len(ref.tokens) == NEW_TOKENS
        if untied and tuple(tokenizer(prompt.text)["input_ids"]) == ref.prompt_ids:
            cases.append(Case(prompt.text, NEW_TOKENS, ref.tokens))
            ids.append(prompt.id)
    print(f"requests: {len(cases)} of {len(rendered)} rendered prompts ({', '.join(ids)}; the others have a "
          "near-tie or stop early)")
    return cases


def greedy_cases(artifact: Path, target: Path) -> list[Case]:
    """Transformers' greedy tokens of the target alone (as the tests' hf_greedy fixture computes them)."""
    import torch
    from transformers import AutoModelForCausalLM

    from fusedspec.validate.prompts import load_tokenizer

    tokenizer = load_tokenizer(artifact)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    cases = []
    for text in PROMPT_TEXTS:
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=151643)
        cases.append(Case(text, NEW_TOKENS, tuple(out[0, ids.shape[1]:].tolist())))
    return cases


def start(version: str, log: Path, *extra: str,
          timeout: float = READY_TIMEOUT_S) -> tuple[ServeProcess, float]:
    port = free_port()
    server = ServeProcess([FUSEDSPEC, "serve", version, "--port", str(port), *extra], serve_env(), log, port)
    try:
        return server, server.wait_ready(timeout)
    except BaseException:  # Ctrl-C while a 1.5B server loads must not leave it running
        stop_process(server.proc)
        raise


def check(report: LoadReport, what: str) -> None:
    if report.errors or report.wrong:
        raise SystemExit(f"{what}: {len(report.errors)} errors, {len(report.wrong)} wrong answers: "
                         f"{(report.errors + report.wrong)[:3]}")


def table(version: str, cases: list[Case], logs: Path, seconds: float, k: int, *, one_at_a_time: bool,
          ready_timeout: float, client_timeout: float) -> None:
    reports: dict[str, dict[int, LoadReport]] = {name: {} for name, _ in MODES}
    ready: dict[str, float] = {}
    servers: dict[str, ServeProcess] = {}
    per_step = 0.0

    def point(name: str, clients: int) -> None:
        server = servers[name]
        model = client_for(server.url).models.list().data[0].id
        report = run_load(server.url, model, cases, clients=clients, seconds=seconds, timeout=client_timeout)
        check(report, f"{name} at c={clients}")
        reports[name][clients] = report
        print(f"  {name} c={clients}: {report.completed} answers, {report.tokens_per_s:.1f} tok/s, "
              f"ITL {report.median_itl_ms():.0f} ms", flush=True)

    try:
        for name, extra in MODES:
            servers[name], ready[name] = start(version, logs / f"{name}.log", "--queue-size", "16", *extra,
                                               timeout=ready_timeout)
            if one_at_a_time:
                for clients in CONCURRENCY:
                    point(name, clients)
                if name == "fused":
                    per_step = tokens_per_step(servers[name].url)
                stop_process(servers.pop(name).proc)
        if not one_at_a_time:
            for clients in CONCURRENCY:
                for name, _ in MODES:
                    point(name, clients)
            per_step = tokens_per_step(servers["fused"].url)
    finally:
        for server in servers.values():
            stop_process(server.proc)
    print(f"\nfused: {per_step:.2f} tokens per request per step over the whole table (k={k})")
    print(f"\ntime to ready (verify, load, warm-up, listen): fused {ready['fused']:.1f} s, target alone "
          f"{ready['target']:.1f} s, ratio {ready['fused'] / ready['target']:.2f}")
    print("\n| c | fused tok/s | target tok/s | ratio | fused ITL ms | target ITL ms | ITL ratio | "
          "answers f/t |")
    print("|---|---|---|---|---|---|---|---|")
    for clients in CONCURRENCY:
        f, t = reports["fused"][clients], reports["target"][clients]
        print(f"| {clients} | {f.tokens_per_s:.1f} | {t.tokens_per_s:.1f} | "
              f"{f.tokens_per_s / t.tokens_per_s:.2f} | {f.median_itl_ms():.1f} | {t.median_itl_ms():.1f} | "
              f"{f.median_itl_ms() / t.median_itl_ms():.2f} | {f.completed}/{t.completed} |")


def ready_times(version: str, logs: Path, runs: int, timeout: float) -> None:
    """Time to ready of each mode over `runs` cold starts, alternating (a start of one mode, then the
    other), with nothing else running; and `fusedspec verify` of the version alone, the part of a start
    that reads every byte."""
    seconds: dict[str, list[float]] = {name: [] for name, _ in MODES}
    verify: list[float] = []
    for i in range(runs):
        started = time.perf_counter()
        cli("verify", version)
        verify.append(time.perf_counter() - started)
        for name, extra in (MODES if i % 2 == 0 else MODES[::-1]):
            server, ready = start(version, logs / f"ready-{name}-{i}.log", *extra, timeout=timeout)
            stop_process(server.proc)
            seconds[name].append(ready)
    cells = ", ".join(f"{name} {statistics.median(s):.1f} s ({', '.join(f'{x:.1f}' for x in s)})"
                      for name, s in seconds.items())
    print(f"\ntime to ready over {runs} cold starts, median (each): {cells}; `fusedspec verify` alone "
          f"{statistics.median(verify):.1f} s ({', '.join(f'{x:.1f}' for x in verify)})")


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
        print(f"\nload: 8 clients, {report.seconds:.0f} s, ready after {ready:.1f} s: {report.completed} "
              f"correct answers, {len(report.wrong)} wrong, {len(report.errors)} errors, {report.rejected} "
              f"answered 429 (Retry-After {sorted(report.retry_after)}), {report.tokens_per_s:.0f} tokens/s, "
              f"median ITL {report.median_itl_ms():.1f} ms; VmRSS {settled[0] / 1024:.0f} MiB after the "
              f"first quarter, {rss[-1] / 1024:.0f} MiB at the end (range "
              f"{(max(settled) - min(settled)) / 1024:.1f} MiB, median "
              f"{statistics.median(settled) / 1024:.0f} MiB)")
        check(report, "load")
        endings = stream_until_cut(server.url, model, Case(cases[0].prompt, 90, ()), cut=server.kill,
                                   clients=8, run_s=2.0, timeout=10)
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
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=("tiny", "real"), default="tiny")
    parser.add_argument("--point-seconds", type=float, default=10.0)
    parser.add_argument("--load-seconds", type=float, default=60.0)
    parser.add_argument("--k", type=int, default=None, help="default: 3 for tiny, 4 for real")
    parser.add_argument("--draft", choices=("perturbed", "copy"), default="perturbed",
                        help="tiny: perturbed is speculation's lower bound (next to no acceptance), copy its "
                             "upper")
    parser.add_argument("--skip-table", action="store_true")
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--ready-runs", type=int, default=0,
                        help="before the table: time to ready of each mode over N cold starts, alternating")
    args = parser.parse_args()
    settings = load_settings()
    runs = settings.work_dir / "bench-serve" / time.strftime("%Y%m%dT%H%M%S")
    runs.mkdir(parents=True)
    real = args.pair == "real"
    k = args.k or (4 if real else 3)
    if real:
        version, cases = real_artifact(settings, k, runs)
        print(f"real pair, tp1 seq256 k{k} batch4 bfloat16 AOTInductor, {NEW_TOKENS} new tokens per request")
    else:
        artifact, target = tiny_artifact(settings, k, args.draft)
        version = publish_artifact(artifact, str(runs / "store"), settings, unvalidated=True).version_uri
        cases = greedy_cases(artifact, target)
        print(f"artifact {artifact.name[:12]} (tiny target, {args.draft} draft, tp1 seq128 k{k} batch4 "
              f"float32), {NEW_TOKENS} new tokens per request, {len(cases)} prompts")
    if args.ready_runs:
        ready_times(version, runs, args.ready_runs, REAL_READY_TIMEOUT_S if real else READY_TIMEOUT_S)
    if not args.skip_table:
        table(version, cases, runs, args.point_seconds, k, one_at_a_time=real,
              ready_timeout=REAL_READY_TIMEOUT_S if real else READY_TIMEOUT_S,
              client_timeout=REAL_CLIENT_TIMEOUT_S if real else CLIENT_TIMEOUT_S)
    if not args.skip_load:
        load(version, cases, runs, args.load_seconds)


if __name__ == "__main__":
    main()
