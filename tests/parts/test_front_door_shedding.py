"""Refusing at the front door on the real HAProxy: the share an ingress response publishes
is applied to its key's later POSTs (429 load_shed with the published Retry-After), passed
on to the ingress, kept from clients, forgotten when stale, and never touches realtime or
another key."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.parts.front_door_support import (
    exchange,
    free_port,
    front_door,
    one_server_config,
    running_haproxy,
    wrapper_environment,
)


class Ingress(BaseHTTPRequestHandler):
    """Publishes `share` (thousandths) with Retry-After 7 on every answer, and notes the
    share HAProxy said it applied to each request that reached it."""

    share = "0"
    applied: list[str | None] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        Ingress.applied.append(self.headers.get(front_door.APPLIED_HEADER))
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", "2")
        self.send_header(front_door.SHARE_HEADER, Ingress.share)
        self.send_header(front_door.RETRY_HEADER, "7")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def shedding_front_door(tmp_path: Path, environment: dict[str, str]) -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Ingress)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = free_port()
    config = one_server_config(tmp_path, port, server.server_address[1])
    try:
        with running_haproxy(config, port, environment):
            yield port
    finally:
        server.shutdown()
        server.server_close()


def post(path: str, priority: str | None = None) -> bytes:
    header = f"X-Priority: {priority}\r\n" if priority else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\n{header}X-Tributary-Front-Shed: 5\r\n"
        "Connection: close\r\nContent-Length: 2\r\n\r\n{}"
    ).encode()


def statuses(port: int, raw: bytes, count: int) -> list[int]:
    return [exchange(port, raw)[0] for _ in range(count)]


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    Ingress.share, Ingress.applied = "0", []
    return wrapper_environment(monkeypatch)


def test_a_published_share_is_refused_at_the_front_for_its_key_alone(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    with shedding_front_door(tmp_path, environment) as port:
        status, headers, _ = exchange(port, post("/v1/embeddings", "normal"))
        assert status == 200 and front_door.SHARE_HEADER not in headers  # kept from clients
        assert Ingress.applied == [None]  # no share yet; the client's own header dropped
        Ingress.share = "950"
        exchange(port, post("/v1/embeddings", "normal"))  # this answer publishes 950
        normal = statuses(port, post("/v1/embeddings", "normal"), 60)
        # One in twenty passes, so 60 may all be refused (~5 % of runs): go on until one
        # has passed under the share and the last was refused.
        seen = list(normal)
        for _ in range(2000):
            status, headers, body = exchange(port, post("/v1/embeddings", "normal"))
            seen.append(status)
            if status == 429 and 200 in seen:
                break
        realtime = statuses(port, post("/v1/embeddings", "realtime"), 10)
        # Other keys have published nothing yet: their first requests pass.
        others = [exchange(port, post("/v1/embeddings"))[0]]
        others.append(exchange(port, post("/v1/rerank", "normal"))[0])
    assert normal.count(429) >= 45 and set(normal) <= {200, 429}
    assert headers["retry-after"] == "7"
    assert json.loads(body)["error"]["code"] == "load_shed"
    assert realtime == [200] * 10  # realtime is never shed at the front
    assert others == [200, 200]
    assert "950" in Ingress.applied  # what passed was told the share it passed under


def test_a_stale_share_is_not_applied(tmp_path: Path, environment: dict[str, str]) -> None:
    with shedding_front_door(tmp_path, environment) as port:
        Ingress.share = "950"
        exchange(port, post("/v1/rerank", "batch"))
        assert statuses(port, post("/v1/rerank", "batch"), 20).count(429) >= 12
        time.sleep(front_door.SHARE_FRESH_S + 1.1)
        assert statuses(port, post("/v1/rerank", "batch"), 1) == [200]


def test_haproxy_and_the_ingress_name_the_same_keys_and_headers() -> None:
    """The wrapper imports nothing of the app's, so it keeps its own copy of the names."""
    from deployments.http import front_shedding
    from deployments.http.hot_routes import HOT_PATHS

    assert {f: set(p) for f, p in front_door.SHED_FAMILIES.items()} == {
        f: set(p) for f, p in front_shedding.FAMILIES.items()
    }
    assert set().union(*front_shedding.FAMILIES.values()) == HOT_PATHS
    assert front_door.SHED_CLASSES == front_shedding.SHED_CLASSES
    assert front_door.SHARE_HEADER == front_shedding.SHARE_HEADER
    assert front_door.RETRY_HEADER == front_shedding.RETRY_HEADER
    assert front_door.APPLIED_HEADER.encode() == front_shedding.APPLIED_HEADER
