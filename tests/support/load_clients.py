"""Closed-loop clients of `fusedspec serve` through the real `openai` client, for the load test
(tests/test_serve_load.py) and the bench (bench/serve_load.py).

    report = run_load(url, model, cases, clients=8, seconds=20)   # LoadReport: counts, tokens, latencies
    report = stream_until_cut(url, model, case, clients=8, cut=kill)  # every client ends, none hangs

Each client sends one request after another until the time is up, alternating whole and streamed answers,
and checks every answer's token ids against the case's expected greedy tokens. A 429 is counted and
honoured: the client sleeps for its Retry-After before sending again. Anything else that is not a correct
answer (a wrong one, an HTTP error, a dropped connection) is recorded by kind. Clients have timeouts: a
client never waits on a server that went away.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import openai
from openai import OpenAI

CLIENT_TIMEOUT_S = 30.0
# The errors of the HTTP library under openai (httpx for openai 1.x, httpx2 for 3.x): openai lets some through
# unwrapped, as when the server dies while openai reads the body of a 429.
TRANSPORT_ERRORS: tuple[type[Exception], ...] = tuple(
    importlib.import_module(name).HTTPError for name in ("httpx", "httpx2") if importlib.util.find_spec(name))


@dataclass(frozen=True)
class Case:
    prompt: str
    max_tokens: int
    expected: tuple[int, ...]  # the target's greedy tokens


@dataclass
class LoadReport:
    clients: int
    seconds: float = 0.0
    completed: int = 0
    rejected: int = 0  # 429s, each retried after its Retry-After
    retry_after: set[str] = field(default_factory=set)
    wrong: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tokens: int = 0
    # streamed: per token, a chunk's gap / its tokens
    inter_token_s: list[float] = field(default_factory=list)
    first_token_s: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def median_itl_ms(self) -> float:
        values = sorted(self.inter_token_s)
        return 1000 * values[len(values) // 2] if values else float("nan")


def client_for(url: str, timeout: float = CLIENT_TIMEOUT_S) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=timeout, max_retries=0)


def ask(client: OpenAI, model: str, case: Case, *, stream: bool) -> tuple[list[int], list[float], float]:
    """The answer's token ids, its streamed per-token gaps, and its time to first token."""
    started = time.perf_counter()
    if not stream:
        answer = client.completions.create(model=model, prompt=case.prompt, max_tokens=case.max_tokens)
        tokens = list((answer.choices[0].model_extra or {})["token_ids"])
        return tokens, [], time.perf_counter() - started
    tokens, gaps = [], []
    first = last = None
    for chunk in client.completions.create(model=model, prompt=case.prompt, max_tokens=case.max_tokens,
                                           stream=True):
        ids = [t for choice in chunk.choices for t in (choice.model_extra or {}).get("token_ids", [])]
        if not ids:
            continue
        now = time.perf_counter()
        if last is None:
            first = now - started
        else:
            gaps += [(now - last) / len(ids)] * len(ids)
        last = now
        tokens += ids
    return tokens, gaps, first if first is not None else time.perf_counter() - started


def _client_loop(url: str, model: str, cases: Sequence[Case], index: int, until: float, report: LoadReport,
                 timeout: float) -> None:
    client = client_for(url, timeout=timeout)
    n = index
    while time.monotonic() < until:
        case = cases[n % len(cases)]
        stream = n % 2 == 1
        n += 1
        try:
            tokens, gaps, first = ask(client, model, case, stream=stream)
        except openai.RateLimitError as exc:
            wait = exc.response.headers.get("retry-after", "1")
            with report.lock:
                report.rejected += 1
                report.retry_after.add(wait)
            time.sleep(min(float(wait), max(0.0, until - time.monotonic())))
            continue
        except (openai.APIError, *TRANSPORT_ERRORS) as exc:
            with report.lock:
                report.errors.append(f"client {index}: {type(exc).__name__}: {exc}")
            continue
        with report.lock:
            if tokens != list(case.expected):
                report.wrong.append(f"client {index}, {case.prompt!r} (stream={stream}): {tokens} != "
                                    f"{case.expected}")
            else:
                report.completed += 1
                report.tokens += len(tokens)
                report.inter_token_s += gaps
                report.first_token_s.append(first)


def run_load(url: str, model: str, cases: Sequence[Case], *, clients: int = 8, seconds: float = 20.0,
             on_tick: Callable[[], None] | None = None, tick_s: float = 0.5,
             timeout: float = CLIENT_TIMEOUT_S) -> LoadReport:
    """`clients` closed loops for `seconds`; on_tick (e.g. an RSS sample) is called every tick_s meanwhile;
    `timeout` bounds each request (a whole answer of a large model on a CPU takes longer than the tests')."""
    report = LoadReport(clients=clients)
    started = time.monotonic()
    until = started + seconds
    threads = [threading.Thread(target=_client_loop, args=(url, model, cases, i, until, report, timeout),
                                daemon=True)
               for i in range(clients)]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        if on_tick is not None:
            on_tick()
        time.sleep(tick_s)
    report.seconds = time.monotonic() - started
    return report


def stream_until_cut(url: str, model: str, case: Case, cut: Callable[[], None], *, clients: int = 8,
                     run_s: float = 2.0, timeout: float = 10.0) -> list[str]:
    """`clients` stream one request after another; after run_s, `cut` runs (it kills the server). Each client
    stops at its first failure; returns how each one ended: "mid-stream:<error>" when the server went away
    between two chunks of an answer, "<error>" when a request found no server, "hung" for a client still
    waiting `timeout` + 5 s after the cut (each read of a stream times out after `timeout`)."""
    endings: list[str] = []
    cut_done = threading.Event()

    def client_stream(index: int) -> None:
        client = client_for(url, timeout=timeout)
        while True:
            chunks = 0
            try:
                for _chunk in client.completions.create(model=model, prompt=case.prompt,
                                                        max_tokens=case.max_tokens, stream=True):
                    chunks += 1
            except openai.RateLimitError:
                time.sleep(0.2)
                continue
            except (openai.APIError, *TRANSPORT_ERRORS) as exc:
                endings.append(f"{'mid-stream:' if chunks else ''}{type(exc).__name__}")
                return
            if cut_done.is_set() and chunks == 0:
                endings.append("empty answer after the cut")
                return

    threads = [threading.Thread(target=client_stream, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(run_s)
    cut()
    cut_done.set()
    deadline = time.monotonic() + timeout + 5
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return endings + ["hung"] * sum(thread.is_alive() for thread in threads)
