"""A process on "another host whose clock is wrong", for the tests that leases are judged by the store's
clock.

    run_skewed(offset_seconds, code, *args, env=...)   run `code` in a child whose clock is off by the offset

Only the child's own clock moves: `time.time` and `time.time_ns` are shifted before anything else runs,
and `socket.gethostname` answers another name, so nothing (a marker's host and pid) tells the child from a
process elsewhere. The store's clock is not touched: the SeaweedFS server keeps its time, and a directory
store's file times come from the kernel.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

PREAMBLE = """
import socket, sys, time
_offset = float(sys.argv.pop(1))
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _offset
time.time_ns = lambda: _time_ns() + int(_offset * 1e9)
socket.gethostname = lambda: "a-host-whose-clock-is-off"
"""


def run_skewed(offset_seconds: float, code: str, *args: str, env: dict[str, str],
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `code` (its argv: `args`) in a child process whose clock is `offset_seconds` off; check it ran."""
    done = subprocess.run([sys.executable, "-c", PREAMBLE + code, str(offset_seconds), *args], env=env,
                          cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"the skewed child failed:\n{done.stdout}\n{done.stderr}"
    return done
