"""`fusedspec serve URI|DIR`: serve one published cpu version over an OpenAI-compatible HTTP API.

In order, as a serving pod starts (serve/):
1. the version as local files: a directory (a pod's mount, a directory store) where it is, an s3:// version
   synced into the cache dir (`<work dir>/cache/serve/<key>`);
2. `registry.verify` against its manifest, as `fusedspec verify` does (`--quick`: sizes only, for a mount
   an init container verified in full). A failed verify is printed problem by problem and the server
   exits 1 without ever listening: it never becomes ready;
3. load the artifact and its tokenizer, one warm-up generation, start the engine thread;
4. listen (uvicorn): /ready answers 200 from here on.
The address is bound first of all (not listened on: a client is refused until step 4), so a port in use or a
host that is not this machine's is a one-line error at once, not after minutes of verify and loading.
SIGINT/SIGTERM: /ready turns 503, requests in flight get up to 5 s, the engine stops, and the process ends
by that signal (uvicorn re-raises it: exit status 130/143). Exit 1 on a failed verify or a failed engine,
2 on bad input (a URI with no version, a neuron version: vLLM serves those).
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
import time
from pathlib import PurePosixPath

from fusedspec.core.errors import ArtifactError, ConfigError
from fusedspec.core.settings import Settings

HELP = "serve a published cpu version over an OpenAI-compatible HTTP API"
DEFAULT_PORT = 8000
MAX_BODY_BYTES = 1 << 20  # == serve.app.MAX_BODY_BYTES (not imported: the app imports FastAPI)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", metavar="URI", help="a version or config path: s3://BUCKET/..., or a directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a pod)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--queue-size", type=int, default=16,
                        help="requests that may wait for a cache line; one more is answered 429 (default %(default)s)")
    parser.add_argument("--request-timeout", type=float, default=120.0,
                        help="seconds a request may take before it is cancelled (default %(default)s)")
    parser.add_argument("--max-request-bytes", type=int, default=MAX_BODY_BYTES,
                        help="largest request body accepted; a larger one is answered 413 before it is read "
                             "(default %(default)s)")
    parser.add_argument("--model-name", help="the model name clients send (default: the target's)")
    parser.add_argument("--quick", action="store_true",
                        help="for a directory: verify manifest, signature, sizes and etags only (an init container "
                             "verified the mount); a copy synced from S3 is always hashed in full")
    parser.add_argument("--target-alone", action="store_true",
                        help="no speculation: the target's own greedy steps (needs compile option target_alone)")


def run(args: argparse.Namespace, settings: Settings) -> int:
    started = time.perf_counter()
    problems = []
    if not 1 <= args.port <= 65535:
        problems.append(f"--port {args.port} must be between 1 and 65535")
    if args.queue_size < 0:
        problems.append(f"--queue-size {args.queue_size} must be 0 or more")
    if not (math.isfinite(args.request_timeout) and args.request_timeout > 0):  # nan and inf parse as floats
        problems.append(f"--request-timeout {args.request_timeout} must be a positive number of seconds")
    if args.max_request_bytes < 1:
        problems.append(f"--max-request-bytes {args.max_request_bytes} must be 1 or more")
    if problems:
        raise ConfigError("; ".join(problems))
    sock = _bind(args.host, args.port)
    try:
        return _verify_and_serve(args, settings, sock, started)
    finally:
        sock.close()


def _bind(host: str, port: int) -> socket.socket:
    """The listening address, bound now as uvicorn binds it (listen comes once the server is ready)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:  # in use, not an address of this machine, an unknown host name
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port, stop "
                          "what listens there, or pass a --host of this machine") from None
    sock.set_inheritable(True)
    return sock


def _verify_and_serve(args: argparse.Namespace, settings: Settings, sock: socket.socket, started: float) -> int:
    from fusedspec.serve.source import open_version

    served = open_version(args.uri, settings, quick=args.quick)
    report = served.report
    if not report.ok:
        print(f"fusedspec serve: refusing to serve {report.uri}: it failed verify against its manifest",
              file=sys.stderr)
        for problem in report.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    manifest = served.manifest
    if manifest.backend != "cpu":
        raise ArtifactError(f"{report.uri} was built by the {manifest.backend!r} backend; `fusedspec serve` runs "
                            "cpu artifacts (a neuron version is served by vLLM: `fusedspec k8s`)")
    how = "sizes" if report.quick else f"{report.bytes_checked} bytes"
    print(f"verified {report.uri} ({report.files_checked} files, {how} match the manifest)"
          + ("" if manifest.validated else "; it is published --unvalidated: it never passed the greedy gate"),
          flush=True)
    return _serve(args, served.files, manifest, sock, started)


def _serve(args: argparse.Namespace, files, manifest, sock: socket.socket, started: float) -> int:  # noqa: ANN001
    import uvicorn

    from fusedspec.compile.cpu.runner import CpuRunner
    from fusedspec.serve.app import ServerState, create_app
    from fusedspec.serve.engine import Engine
    from fusedspec.serve.metrics import ServeMetrics
    from fusedspec.serve.text import ArtifactText

    runner = CpuRunner(files)
    text = ArtifactText(files)
    speculate = not args.target_alone
    runner.require_programs(speculate=speculate)
    runner.generate([[0]], 2, speculate=speculate)  # warm-up: first calls of the programs are the slow ones
    metrics = ServeMetrics(runner.spec.speculation_length if speculate else 1)
    engine = Engine(runner, metrics, max_queue=args.queue_size, speculate=speculate)
    target = manifest.models.target
    state = ServerState(engine=engine, text=text, metrics=metrics,
                        model_name=args.model_name or target.repo_id or PurePosixPath(target.ref).name,
                        key=manifest.key, seq_len=runner.max_model_len, request_timeout_s=args.request_timeout,
                        max_body_bytes=args.max_request_bytes)
    engine.start()
    config = uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    print(f"starting {state.model_name} ({manifest.key[:12]}, {runner.lines} cache lines, "
          f"{'fused k=' + str(runner.spec.speculation_length) if speculate else 'target alone'}) on "
          f"http://{args.host}:{args.port} after {time.perf_counter() - started:.1f} s", flush=True)
    server.run(sockets=[sock])
    engine.stop()
    if engine.failure:
        print(f"fusedspec serve: {engine.failure}", file=sys.stderr)
        return 1
    return 0 if server.started else 1
