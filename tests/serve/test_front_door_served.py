"""HAProxy in front of the real app: Serve starts it through Tributary's wrapper, so the
config it runs has the JSON error files, and malformed HTTP is a 400, never a 5xx; its files
are in a directory of this user and this instance, not in Serve's shared /tmp/haproxy-serve."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx

from bench.server import descendants
from tests.serve.conftest import AUTH, MODEL, Server

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


def test_haproxy_sends_serves_manager_no_line_per_request(server: Server) -> None:
    """The launcher turns Serve's per-request HAProxy log off (docs/operations.md, "Serve's
    per-request log"): the ingress counts requests itself, and HAProxy's exporter still
    counts what HAProxy answers alone."""
    for argv in haproxy_commands(server):
        text = Path(argv[argv.index("-f") + 1]).read_text()
        assert "format rfc5424" not in text and "log-format-sd" not in text
        assert "prometheus-exporter" in text
    answer = httpx.post(
        f"{server.url}/v1/embeddings", json={"model": MODEL, "input": "x"}, headers=AUTH
    )
    assert answer.status_code == 200


def test_haproxys_files_are_the_instances_own(server: Server) -> None:
    (argv, *_) = haproxy_commands(server)
    config = Path(argv[argv.index("-f") + 1])
    # <user dir>/<instance>/<node id>/haproxy.tributary.cfg (deployments/launch/paths.py)
    instance, user_dir = config.parents[1], config.parents[2]
    assert user_dir.name == f"tributary-{os.geteuid()}", config
    for directory in (instance, user_dir):
        assert directory.stat().st_mode & 0o777 == 0o700
        assert directory.stat().st_uid == os.geteuid()
    for other in haproxy_commands(server):
        assert Path(other[other.index("-f") + 1]).is_relative_to(instance)


def test_a_garbage_request_line_is_a_400_and_a_close(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(b"GARBAGE\r\n\r\n")
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]


def test_the_share_to_refuse_reaches_haproxy_and_never_the_client(server: Server) -> None:
    """The ingress publishes each key's share on its answers; HAProxy takes the headers
    off (deployments/http/front_shedding.py). Idle, the share is zero."""
    answer = httpx.post(
        f"{server.url}/v1/embeddings",
        json={"model": MODEL, "input": "a quiet day"},
        headers={**AUTH, "X-Priority": "batch", "X-Tributary-Front-Shed": "900"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    assert not [name for name in answer.headers if name.startswith("x-tributary-")]
    shares = httpx.get(f"{server.url}/v1/stats", timeout=30).json()["front_door_shares"]
    assert shares.get("embed_batch") == 0.0
