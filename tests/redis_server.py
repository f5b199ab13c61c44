"""A throwaway redis-server for the tests and the soak: on a port of the caller's, bound to
loopback, nothing saved (a restart starts it empty)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

START_TIMEOUT_S = 10


class RedisDidNotStart(RuntimeError):
    pass


def start_redis(binary: str, port: int, workdir: Path, *extra: str) -> subprocess.Popen[bytes]:
    """Starts it and returns once it answers PING; `extra`: more server options.

    A port that accepts a connection is not proof enough: between choosing a free port and
    binding it, another process may take it, our server exits, and a client would then wait
    forever on a listener that never speaks Redis. So the server must be alive and answer."""
    args = [binary, "--port", str(port), "--bind", "127.0.0.1"]
    args += ["--save", "", "--appendonly", "no", "--dir", str(workdir), *extra]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        if _answers_ping(port):
            return process
        time.sleep(0.05)
    exited = process.poll() is not None
    process.kill()
    process.wait()
    reason = "exited (is its port taken?)" if exited else "did not answer PING"
    raise RedisDidNotStart(f"redis-server on port {port} {reason}")


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as connection:
            connection.settimeout(0.5)
            connection.sendall(b"PING\r\n")
            return connection.recv(16).startswith(b"+PONG")
    except OSError:
        return False
