"""`fusedspec serve URI|DIR`: serve one published cpu version over an OpenAI-compatible HTTP API.

In order, as a serving pod starts (serve/):
1. the version checked without reading it: manifest, signature (with a verify key), the store's listing
   (registry.verify, quick); an s3:// version is then synced into the cache dir
   (`<work dir>/cache/serve/<key>`).
   A failed check is printed problem by problem and the server exits 1 without ever listening;
2. load the artifact and its tokenizer through the manifest (serve/source.py: every file hashed as it is
   read, native code only from a signed version or a build of this work dir): a file that differs, or
   native code nothing vouches for, ends the process with exit 1 naming the file, before it listens;
3. one warm-up generation, start the engine thread;
4. listen (uvicorn, serve/connections.py: request heads within the request timeout, a connection cap):
   /ready answers 200 from here on. Access logs (one line per request) go to stderr unless --no-access-log.
The address is bound first of all (not listened on: a client is refused until step 4), so a port in use or a
host that is not this machine's is a one-line error at once, not after minutes of loading.
SIGINT/SIGTERM: /ready turns 503, requests in flight get up to 5 s, the engine stops, and the process ends
by that signal (uvicorn re-raises it: exit status 130/143). Exit 1 on a failed check or a failed engine,
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

DEFAULT_PORT = 8000
MAX_BODY_BYTES = 1 << 20  # == serve.app.MAX_BODY_BYTES (not imported: the app imports FastAPI)
DEFAULT_MAX_CONNECTIONS = 512


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", metavar="URI",
                        help="a version or config path: s3://BUCKET/..., or a directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a pod)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--queue-size", type=int, default=16,
                        help="requests that may wait for a cache line; one "
                             "more is answered 429 (default %(default)s)")
    parser.add_argument("--request-timeout", type=float, default=120.0,
                        help="seconds a request may take before it is cancelled (default %(default)s)")
    parser.add_argument("--max-request-bytes", type=int, default=MAX_BODY_BYTES,
                        help="largest request body accepted; a larger one is answered 413 before it is read "
                             "(default %(default)s)")
    parser.add_argument("--model-name", help="the model name clients send (default: the target's)")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="open connections at most; beyond it the one waiting longest for its request "
                             "head is closed (default %(default)s, and "
                             "below the process's file descriptor limit)")
    parser.add_argument("--no-access-log", action="store_true", help="no line per request on stderr")
    parser.add_argument("--target-alone", action="store_true",
                        help="no speculation: the target's own greedy "
                             "steps (needs compile option target_alone)")


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
    if args.max_connections < 1:
        problems.append(f"--max-connections {args.max_connections} must be 1 or more")
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
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port, "
                          "stop what listens there, or pass a --host of this machine") from None
    sock.set_inheritable(True)
    return sock


def _verify_and_serve(args: argparse.Namespace, settings: Settings, sock: socket.socket,
                      started: float) -> int:
    from fusedspec.core.errors import VerificationError
    from fusedspec.serve.source import load_served, open_version

    served = open_version(args.uri, settings)
    report = served.report
    if not report.ok:
        print(f"fusedspec serve: refusing to serve {report.uri}: it failed verify against its manifest",
              file=sys.stderr)
        for problem in report.problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    manifest = served.manifest
    if manifest.backend != "cpu":
        raise ArtifactError(f"{report.uri} was built by the {manifest.backend!r} backend; `fusedspec serve` "
                            "runs cpu artifacts (a neuron version is served by vLLM: `fusedspec k8s`)")
    print(f"checked {report.uri} ({report.files_checked} files listed as the manifest says"
          f"{', signed by ' + report.signer if report.signer else ', unsigned'}); loading, every byte hashed"
          + ("" if manifest.validated else "; it is published --unvalidated: "
                                           "it never passed the greedy gate"),
          flush=True)
    try:
        loaded = load_served(served, settings)
    except VerificationError as exc:
        print(f"fusedspec serve: refusing to serve: {exc}", file=sys.stderr)
        return 1
    print(f"loaded: all {len(manifest.files)} files match the manifest "
          f"({sum(e.size for e in manifest.files.values())} bytes hashed as they loaded)", flush=True)
    return _serve(args, loaded, manifest, sock, started)


def _serve(args: argparse.Namespace, loaded, manifest, sock: socket.socket, started: float) -> int:  # noqa: ANN001
    import asyncio
    import logging

    import uvicorn

    from fusedspec.serve.app import ServerState, create_app
    from fusedspec.serve.connections import ConnectionGuard
    from fusedspec.serve.engine import Engine
    from fusedspec.serve.metrics import ServeMetrics

    runner, text = loaded.runner, loaded.text
    speculate = not args.target_alone
    runner.require_programs(speculate=speculate)
    runner.generate([[0]], 2, speculate=speculate)  # warm-up: first calls of the programs are the slow ones
    metrics = ServeMetrics(runner.spec.speculation_length if speculate else 1)
    engine = Engine(runner, metrics, max_queue=args.queue_size, speculate=speculate)
    target = manifest.models.target
    state = ServerState(engine=engine, text=text, metrics=metrics,
                        model_name=args.model_name or target.repo_id or PurePosixPath(target.ref).name,
                        key=manifest.key, seq_len=runner.max_model_len,
                        request_timeout_s=args.request_timeout, max_body_bytes=args.max_request_bytes)
    _log_to_stderr(logging.WARNING if args.no_access_log else logging.INFO)
    guard = ConnectionGuard(header_timeout_s=args.request_timeout, max_connections=args.max_connections)
    # the lifespan's end: uvicorn re-raises SIGTERM after it, ending the process
    state.on_shutdown = guard.summary
    engine.start()
    config = uvicorn.Config(create_app(state), host=args.host, port=args.port, log_level="warning",
                            access_log=False, timeout_graceful_shutdown=5, loop="asyncio",
                            http=guard.protocol(), backlog=guard.backlog, log_config=None)
    server = uvicorn.Server(config)
    print(f"starting {state.model_name} ({manifest.key[:12]}, {runner.lines} cache lines, "
          f"{'fused k=' + str(runner.spec.speculation_length) if speculate else 'target alone'}) on "
          f"http://{args.host}:{args.port} after {time.perf_counter() - started:.1f} s", flush=True)

    async def serve() -> None:
        asyncio.get_running_loop().set_exception_handler(guard.loop_exception)
        await server.serve(sockets=[sock])

    try:
        asyncio.run(serve())
    finally:
        engine.stop()
    if engine.failure:
        print(f"fusedspec serve: {engine.failure}", file=sys.stderr)
        return 1
    return 0 if server.started else 1


def _log_to_stderr(access_level: int) -> None:
    """The server's own lines (access log, connection guard, uvicorn's errors) on stderr, one per line."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name, level in (("fusedspec.serve", logging.WARNING), ("fusedspec.serve.access", access_level),
                        ("uvicorn.error", logging.WARNING)):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = False
        logger.addHandler(handler)
