"""A throwaway redis-server for the tests and the soak: on a port of the caller's, bound to
loopback, nothing saved (a restart starts it empty)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

START_TIMEOUT_S = 10


def start_redis(binary: str, port: int, workdir: Path, *extra: str) -> subprocess.Popen[bytes]:
    """Starts it and returns once it accepts connections; `extra`: more server options."""
    args = [binary, "--port", str(port), "--bind", "127.0.0.1"]
    args += ["--save", "", "--appendonly", "no", "--dir", str(workdir), *extra]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    process.wait()
    raise RuntimeError("redis-server did not start")
