"""`make serve` right after a stopped one comes up on the same metrics port (issue 12, 8).

A stopped run's metrics server leaves its closed connections in TIME_WAIT for a minute; the
launcher's check that the port is free once took them for a listener and refused to start.
The test leaves that state the way the stopped server does (its side closes first) rather
than starting and stopping a whole app for it: on a busy machine the stop itself outlasted
the minute, and the state had to be made this way anyway. The start also finds HAProxy's
fixed side ports (Prometheus 9101, stats 8404) taken, as a second Serve on the machine or a
HAProxy a killed node left would hold them: HAProxy once exited at start-up on them, and
Serve with it."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx

from bench.server import embedder_only_config, free_port, running_server

TIME_WAIT = "06"  # the state column of /proc/net/tcp


def time_wait_on(port: int) -> bool:
    """Whether a connection of this local port is in TIME_WAIT (IPv4 or IPv6)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == TIME_WAIT:
                return True
    return False


@contextlib.contextmanager
def listeners_on(ports: list[int]) -> Iterator[None]:
    """Listens on each port that is free (one already taken is taken all the same)."""
    with contextlib.ExitStack() as stack:
        for port in ports:
            holder = stack.enter_context(socket.socket())
            try:
                holder.bind(("", port))
            except OSError:
                continue
            holder.listen()
        yield


def leave_time_wait(port: int) -> None:
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the server's side closes first
            client.recv(1)


def scrape(url: str) -> str:
    # "Connection: close" makes the server close first, which leaves the TIME_WAIT on its
    # side: with keep-alive the client may close first and the TIME_WAIT is the client's.
    response = httpx.get(url, timeout=30, headers={"Connection": "close"})
    assert response.status_code == 200
    return response.text


def test_a_start_on_the_metrics_port_a_stopped_run_left_in_time_wait(tmp_path: Path) -> None:
    port = free_port()
    leave_time_wait(port)
    assert time_wait_on(port), "the condition under test did not arise"
    # The default app as `make serve` runs it, but for its reranker and LLM: they open no
    # port of their own.
    with (
        listeners_on([9101, 8404]),
        running_server(embedder_only_config(), tmp_path, metrics_port=port) as server,
    ):
        assert server.metrics_port == port
        for _ in range(3):
            assert "ray_" in scrape(server.metrics_url)
        health = httpx.get(f"{server.url}/healthz", timeout=10)
        assert health.status_code == 200, health.text  # which deployment, if any, was not
        assert "HAProxy takes" in server.log_tail(100_000)
