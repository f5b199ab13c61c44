"""deployments/bin/haproxy-tributary's queue bounds on the real HAProxy: past the bound a
POST is refused at once (realtime may go past it), a request queued past the timeout gets a
JSON 503, and the bounds come from the environment onto every backend with servers."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.parts.front_door_support import (
    exchange,
    free_port,
    front_door,
    one_server_config,
    running_haproxy,
    serve_generated_config,
    wrapper_environment,
)


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return wrapper_environment(monkeypatch)


class OneAtATime:
    """A backend that takes one connection at a time and notes the order in which request
    paths reach it; it holds the first request until `release` is set, and answers the
    others with 200 at once."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.release = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = int(self.listener.getsockname()[1])
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                request = connection.recv(65536)
                self.seen.append(request.split(b" ", 2)[1].decode())
                if len(self.seen) == 1:
                    self.release.wait(timeout=20)
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}"
                )

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 10
        while len(self.seen) < count:
            assert time.monotonic() < deadline, f"the backend saw only {self.seen}"
            time.sleep(0.02)


@contextlib.contextmanager
def bounded_front_door(
    tmp_path: Path, environment: dict[str, str], **bounds: str
) -> Iterator[tuple[int, OneAtATime]]:
    """HAProxy through the wrapper in front of one OneAtATime server, with the queue
    bounds given as the wrapper's environment variables."""
    port, backend = free_port(), OneAtATime()
    config = one_server_config(tmp_path, port, backend.port)
    try:
        with running_haproxy(config, port, {**environment, **bounds}):
            yield port, backend
    finally:
        backend.release.set()
        backend.listener.close()


def post(path: str, priority: str | None = None) -> bytes:
    header = f"X-Priority: {priority}\r\n" if priority else ""
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{header}Content-Length: 2\r\n\r\n{{}}".encode()


def sent(port: int, raw: bytes) -> socket.socket:
    """A connection on which `raw` has been sent; its answer is read later."""
    connection = socket.create_connection(("127.0.0.1", port), timeout=30)
    connection.sendall(raw)
    return connection


def status_of(connection: socket.socket) -> int:
    with connection:
        answer = b""
        while b"\r\n" not in answer and (chunk := connection.recv(65536)):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def test_past_the_queue_bound_a_post_is_refused_at_once_and_realtime_goes_first(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    with bounded_front_door(
        tmp_path, environment, TRIBUTARY_INGRESS_MAXCONN="1", TRIBUTARY_FRONT_QUEUE="2"
    ) as (port, backend):
        first = sent(port, post("/first"))
        backend.wait_for(1)  # /first holds the one connection the server may have
        queued = [sent(port, post(name)) for name in ("/n1", "/n2", "/n3")]
        time.sleep(0.5)  # HAProxy queues them: 3 waiting, past the bound of 2
        started = time.monotonic()
        status, headers, body = exchange(port, post("/refused"))
        refused_after = time.monotonic() - started
        realtime = sent(port, post("/rt", "realtime"))  # past the bound, under 4x it
        time.sleep(0.5)
        backend.release.set()
        answers = [status_of(c) for c in (first, *queued, realtime)]
    assert status == 503 and refused_after < 1  # at once, not after the queue drained
    assert int(headers["retry-after"]) >= 1
    assert json.loads(body)["error"]["code"] == "server_overloaded"
    assert answers == [200] * 5  # everything that was queued was served
    assert "/refused" not in backend.seen
    assert backend.seen[:2] == ["/first", "/rt"], backend.seen  # realtime jumped the queue


def test_a_request_queued_past_the_timeout_gets_a_json_503(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    with bounded_front_door(
        tmp_path,
        environment,
        TRIBUTARY_INGRESS_MAXCONN="1",
        TRIBUTARY_FRONT_QUEUE_TIMEOUT_S="1",
    ) as (port, backend):
        holder = sent(port, post("/holds"))
        backend.wait_for(1)
        started = time.monotonic()
        status, headers, body = exchange(port, post("/waits"))
        waited = time.monotonic() - started
        backend.release.set()
        assert status_of(holder) == 200
    assert status == 503 and 0.9 < waited < 5
    assert int(headers["retry-after"]) >= 1
    assert json.loads(body)["error"]["type"] == "server_error"


def test_queue_bounds_come_from_the_environment_and_refuse_nonsense() -> None:
    bounds = front_door.QueueBounds.from_environment(
        {"TRIBUTARY_INGRESS_MAXCONN": "8", "TRIBUTARY_FRONT_QUEUE": " 3 "}
    )
    assert (bounds.ingress_maxconn, bounds.queue, bounds.queue_timeout_s) == (8, 3, 5)
    with pytest.raises(SystemExit, match="TRIBUTARY_FRONT_QUEUE must be a positive integer"):
        front_door.QueueBounds.from_environment({"TRIBUTARY_FRONT_QUEUE": "0"})


def test_the_patch_bounds_every_backend_with_servers_and_only_those(tmp_path: Path) -> None:
    original = serve_generated_config(tmp_path).read_text()
    patched = front_door.patch_config(original, {}, front_door.QueueBounds(512, 64, 9))
    backend = patched.split("\nbackend default\n", 1)[1].split("\nlisten ", 1)[0]
    assert "timeout queue 9s" in backend and "queue gt 64" in backend
    servers = [line for line in backend.splitlines() if line.strip().startswith("server ")]
    assert servers and all(line.endswith(" maxconn 512") for line in servers)
    not_found = patched.split("\nbackend default_backend\n", 1)[1].split("\nbackend ", 1)[0]
    assert "queue" not in not_found
