"""What `/metrics` exposes, in the Prometheus text format (prometheus_client, a registry per server).

Speculation:  fusedspec_tokens_per_step (histogram: tokens one fused step gave one request, 1..k),
              fusedspec_generated_tokens_total, fusedspec_draft_tokens_proposed_total (k-1 per request per
              step) and fusedspec_draft_tokens_accepted_total; acceptance = accepted / proposed, also kept
              as the gauge fusedspec_acceptance_rate since the server started.
Latency:      fusedspec_inter_token_latency_seconds (a step that gives a request n tokens counts n tokens
              of step_time / n each: what a client of the stream sees on average), fusedspec_time_to_first_
              token_seconds, fusedspec_step_seconds (one step over every line).
Load:         fusedspec_queue_depth (requests admitted and waiting for a cache line), fusedspec_active_lines,
              fusedspec_requests_total{outcome} with outcome one of OUTCOMES.
Process:      process_resident_memory_bytes, process_cpu_seconds_total, ... (prometheus_client's own).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

OUTCOMES = ("completed", "rejected_queue_full", "bad_request", "timeout", "client_disconnected", "error")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServeMetrics:
    def __init__(self, speculation_length: int):
        self.registry = CollectorRegistry()
        self.k = speculation_length
        r = self.registry
        self.tokens_per_step = Histogram("fusedspec_tokens_per_step", "tokens one step gave one request",
                                         buckets=tuple(range(1, speculation_length + 1)), registry=r)
        self.generated = Counter("fusedspec_generated_tokens", "tokens generated (first tokens included)",
                                 registry=r)
        self.proposed = Counter("fusedspec_draft_tokens_proposed",
                                "draft tokens proposed (k-1 per request per step)", registry=r)
        self.accepted = Counter("fusedspec_draft_tokens_accepted", "draft tokens the target accepted",
                                registry=r)
        self.acceptance = Gauge("fusedspec_acceptance_rate", "draft tokens accepted / proposed since start",
                                registry=r)
        self.itl = Histogram("fusedspec_inter_token_latency_seconds", "time between tokens of one request",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("fusedspec_time_to_first_token_seconds", "request admitted to first token",
                              buckets=LATENCY_BUCKETS + (5.0, 10.0), registry=r)
        self.step_seconds = Histogram("fusedspec_step_seconds", "one step over every cache line",
                                      buckets=LATENCY_BUCKETS, registry=r)
        self.queue_depth = Gauge("fusedspec_queue_depth", "requests waiting for a cache line", registry=r)
        self.active_lines = Gauge("fusedspec_active_lines", "cache lines decoding a request", registry=r)
        self.requests = Counter("fusedspec_requests", "requests by outcome", ["outcome"], registry=r)
        ProcessCollector(registry=r)  # process_resident_memory_bytes and friends: a leak shows on a dashboard
        for outcome in OUTCOMES:  # every series exists from the start, at 0
            self.requests.labels(outcome=outcome)
        self._proposed = self._accepted = 0

    def step(self, seconds: float, tokens_per_request: list[int]) -> None:
        """One step over every line; the tokens it gave each request it advanced."""
        self.step_seconds.observe(seconds)
        for tokens in tokens_per_request:
            self.tokens_per_step.observe(tokens)
            self.generated.inc(tokens)
            if self.k > 1:  # the target alone proposes nothing
                self.proposed.inc(self.k - 1)
                self.accepted.inc(tokens - 1)
                self._proposed, self._accepted = self._proposed + self.k - 1, self._accepted + tokens - 1
        if self._proposed:
            self.acceptance.set(self._accepted / self._proposed)

    def first_token(self, seconds: float) -> None:
        self.ttft.observe(seconds)
        self.generated.inc()

    def tokens_arrived(self, gap_s: float, count: int) -> None:
        for _ in range(count):
            self.itl.observe(gap_s / count)

    def load(self, waiting: int, active: int) -> None:
        self.queue_depth.set(waiting)
        self.active_lines.set(active)

    def outcome(self, outcome: str) -> None:
        assert outcome in OUTCOMES, outcome
        self.requests.labels(outcome=outcome).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
