"""HAProxy in front of the real app: Serve starts it through Tributary's wrapper, so the
config it runs has the JSON error files, and malformed HTTP is a 400, never a 5xx."""

from __future__ import annotations

import socket
from pathlib import Path

from bench.server import descendants
from tests.serve.conftest import Server

ERRORS = Path(__file__).resolve().parents[2] / "deployments" / "static" / "errors"


def haproxy_commands(server: Server) -> list[list[str]]:
    commands = []
    for pid in descendants(server.process.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"/haproxy"):
            commands.append([a.decode() for a in argv if a])
    return commands


def test_serves_haproxy_runs_the_patched_config_without_splicing(server: Server) -> None:
    commands = haproxy_commands(server)
    assert commands, "no HAProxy under the server (is the mode haproxy or throughput?)"
    for argv in commands:
        assert "-dS" in argv
        config = Path(argv[argv.index("-f") + 1])
        assert config.name == "haproxy.tributary.cfg"
        text = config.read_text()
        assert f"errorfile 503 {ERRORS / '503.http'}" in text
        assert f"errorfile 400 {ERRORS / '400.http'}" in text


def test_a_garbage_request_line_is_a_400_and_a_close(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(b"GARBAGE\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
