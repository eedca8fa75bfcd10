"""Run a Neuron step in its own Python process, with its own environment, and bring back its result or error.

Why: NxDI 0.6 (the SDK 2.26 stack) enables fused speculation with `self.__class__._model_cls =
NeuronFusedSpecModel` (models/model_base.py, NeuronBaseForCausalLM.__init__, tag v0.6.10598), which changes
the class for the rest of the process: the next build (or the target-only reference) then finds the wrong
`_model_cls` and fails. 0.7.0 sets it on the instance (fcb5a86). NxDI and the compiler also read
environment variables (BASE_COMPILE_WORK_DIR, NEURON_LOGICAL_NC_CONFIG, ...) that threads of one process
would share. A fresh process per compile, load and reference build avoids both, whatever the fan-out
(local threads, Dask workers, Prefect runs) and whatever NxDI version.

    run_isolated(function, *args, env=..., what=...)    one call in a fresh process, returns its result
    IsolatedSession(setup, *args, env=..., what=...)    a process that keeps `setup`'s state (a loaded model)
        .info                                           the small, picklable part `setup` returned
        .call(function, *args)                          function(state, *args) in that process
        .close()                                        ends it (also at garbage collection and exit)

The child is `python -m compile.neuron.isolation FD`, started with subprocess (Dask's daemonic workers may not
fork multiprocessing children), its environment given at start (so it is set before any Neuron import), and
stdout/stderr shared with the parent (compiler logs stay visible). Requests and replies travel pickled over a
socket pair, never over stdout. Functions are sent by reference, so they must be module-level.

Errors: a FusedspecError raised in the child is raised again in the parent with the same class, message and
attributes (so exit codes hold). Any other exception becomes a CompileError naming its type, message and the
child's traceback. A child that dies without answering (killed by the OOM killer, a signal, a crash) is a
CompileError naming the signal or exit code; the parent never hangs on it.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from fusedspec.core.errors import CompileError, FusedspecError

POLL_SECONDS = 1.0
STOP_GRACE_SECONDS = 10.0
# The directory holding the `compile` package: put first on the child's path so it imports this code.
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
KILL_HINTS = {signal.SIGKILL: "usually the kernel's out-of-memory killer: give the compile more host memory "
                              "(see docs/trainium.md, The compile node)"}


# ---- parent side ---------------------------------------------------------------------------------------


def run_isolated(function: Callable[..., Any], *args: Any, env: dict[str, str], what: str) -> Any:
    """function(*args) in a fresh process whose environment is this one's updated with `env`."""
    child = _Child(env, what)
    try:
        child.send(("call", function, args))
        return child.receive()
    finally:
        child.stop()


class IsolatedSession:
    """A process holding the state `setup(*args)` builds; `setup` returns (state, info), info is sent back."""

    def __init__(self, setup: Callable[..., tuple[Any, Any]], *args: Any, env: dict[str, str],
                 what: str) -> None:
        self.what = what
        self._child = _Child(env, what)
        self._lock = threading.Lock()  # one request at a time on the one connection
        # Ends the child when the session is collected or the interpreter exits, even without close().
        self._finalizer = weakref.finalize(self, self._child.stop)
        try:
            self._child.send(("session", setup, args))
            self.info: Any = self._child.receive()
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self._child.process.pid

    def call(self, function: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            if not self._finalizer.alive:
                raise CompileError(f"{self.what}: its process was closed; load the artifact again")
            self._child.send(("call", function, args))
            return self._child.receive()

    def close(self) -> None:
        self._finalizer()


class _Child:
    def __init__(self, env: dict[str, str], what: str) -> None:
        self.what = what
        ours, theirs = socket.socketpair()
        child_env = {**os.environ, **env}
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (PROJECT_ROOT, child_env.get("PYTHONPATH")) if p)
        try:
            self.process = subprocess.Popen(  # noqa: S603 - our own module, run by this interpreter
                # -P: the working directory does not shadow PROJECT_ROOT, so the child runs this very code.
                [sys.executable, "-P", "-m", "fusedspec.compile.neuron.isolation", str(theirs.fileno())],
                env=child_env, pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self.connection = Connection(ours.detach())

    def send(self, request: tuple[str, Callable[..., Any], tuple[Any, ...]]) -> None:
        try:
            self.connection.send(request)
        except (BrokenPipeError, ConnectionResetError, OSError):
            raise self._death() from None

    def receive(self) -> Any:
        """The child's reply; raises what the child raised, or CompileError when it died without replying."""
        while True:
            try:
                if self.connection.poll(POLL_SECONDS):
                    status, payload = self.connection.recv()
                    break
            except (EOFError, ConnectionResetError, OSError):
                raise self._death() from None
            if self.process.poll() is not None and not self.connection.poll(0):
                raise self._death()
        if status == "ok":
            return payload
        raise _rebuild(payload, self.what)

    def _death(self) -> CompileError:
        try:
            code = self.process.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:  # the channel broke but the process lingers
            self.process.kill()
            code = self.process.wait()
        if code < 0:
            sig = signal.Signals(-code)
            hint = KILL_HINTS.get(sig)
            return CompileError(f"{self.what}: its process was killed by {sig.name}"
                                + (f" ({hint})" if hint else "") + "; nothing from it was kept")
        return CompileError(f"{self.what}: its process exited with code {code} without a result; nothing "
                            "from it was kept (its output above says why)")

    def stop(self) -> None:
        """End the child: ask it to leave, then terminate, then kill. Safe to call more than once."""
        if self.process.poll() is None:
            try:
                self.connection.send(None)
            except OSError:
                pass
            try:
                self.process.wait(timeout=STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.terminate()
                try:
                    self.process.wait(timeout=STOP_GRACE_SECONDS)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
        self.connection.close()


def _rebuild(payload: dict[str, Any], what: str) -> BaseException:
    """The exception the child raised, as an object of this process."""
    cls = _fusedspec_class(payload.get("module"), payload.get("name"))
    if cls is not None:
        error = FusedspecError.__new__(cls)  # without __init__: the attributes are restored below
        Exception.__init__(error, payload["message"])
        error.__dict__.update(payload.get("attributes") or {})
        return error
    return CompileError(f"{what} failed: {payload['name']}: {payload['message']}\n"
                        f"--- traceback in that process ---\n{payload['traceback'].rstrip()}")


def _fusedspec_class(module: str | None, name: str | None) -> type[FusedspecError] | None:
    if not module or not name or module.split(".")[0] != "fusedspec":
        return None
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, FusedspecError) else None


# ---- child side ------------------------------------------------------------------------------------------


def _error_payload(exc: BaseException) -> dict[str, Any]:
    attributes: dict[str, Any] = {}
    try:
        pickle.dumps(exc.__dict__)
        attributes = dict(exc.__dict__)
    except Exception:  # noqa: BLE001 - an attribute that cannot travel is dropped, the message still does
        attributes = {}
    return {"module": type(exc).__module__, "name": type(exc).__qualname__, "message": str(exc),
            "attributes": attributes, "traceback": "".join(traceback.format_exception(exc))}


def _serve(connection: Connection) -> None:
    state: Any = None
    in_session = False
    while True:
        try:
            request = connection.recv()
        except EOFError:  # the parent is gone
            return
        if request is None:
            return
        kind, function, args = request
        try:
            if kind == "session":
                state, result = function(*args)
                in_session = True
            else:
                result = function(state, *args) if in_session else function(*args)
            reply = ("ok", result)
            pickle.dumps(reply)  # a result that cannot travel is an error of its own, not a dead child
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the parent
            connection.send(("error", _error_payload(exc)))
            if kind == "session":
                return
            continue
        connection.send(reply)


def _exit_with_parent(interval: float = 5.0) -> None:
    """A step outliving its parent (killed, or lost with its machine's session) would compile for hours for no
    one: end this process when the parent is gone. Checked by a daemon thread, since a compile never reads
    the socket until it is done."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def main(argv: list[str]) -> int:
    _exit_with_parent()
    connection = Connection(int(argv[0]))
    try:
        _serve(connection)
    finally:
        connection.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
