"""One ingress replica kept for realtime, on the real HAProxy through the wrapper: with
TRIBUTARY_REALTIME_INGRESS naming the app, `X-Priority: realtime` requests go to the first
replica and nothing else does; while it is down realtime goes to the others, and while
they are down the rest goes to Serve's fallback, never to the kept replica."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.parts.front_door_support import (
    exchange,
    free_port,
    front_door,
    running_haproxy,
    wrapper_environment,
)

APP = "app"
KEPT = "SERVE_REPLICA_app-ingress-aaaa"  # first by name: the one kept for realtime
OTHER = "SERVE_REPLICA_app-ingress-bbbb"
FALLBACK = "SERVE_PROXY_ACTOR-fallback-1"


def named(name: str) -> type[BaseHTTPRequestHandler]:
    class Named(BaseHTTPRequestHandler):
        """Answers every request with its server's name; 200 to Serve's health check."""

        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            body = name.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    return Named


class Servers:
    """The kept replica, the other one and the fallback, each a real HTTP server."""

    def __init__(self) -> None:
        self.running = {
            name: ThreadingHTTPServer(("127.0.0.1", 0), named(name))
            for name in (KEPT, OTHER, FALLBACK)
        }
        self.ports = {name: s.server_address[1] for name, s in self.running.items()}
        for server in self.running.values():
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def stop(self, name: str) -> None:
        server = self.running.pop(name)
        server.shutdown()
        server.server_close()

    def close(self) -> None:
        for name in list(self.running):
            self.stop(name)


def serve_shaped_config(directory: Path, port: int, ports: dict[str, int]) -> Path:
    """The parts of Serve's generated config that decide where a request goes: its
    defaults (retry on a failed connect, elsewhere), its health checks, and an app backend
    of two ingress replicas and the fallback proxy as a backup."""
    config = directory / "haproxy.cfg"
    config.write_text(
        "global\n    maxconn 64\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 30s\n"
        "    timeout server 30s\n    option redispatch 1\n    retry-on conn-failure\n"
        "    balance leastconn\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n    use_backend http-{APP}\n"
        f"backend http-{APP}\n"
        "    option httpchk GET /-/healthz\n    http-check expect status 200\n"
        "    default-server fastinter 250ms downinter 250ms fall 2 rise 2 inter 1s check\n"
        f"    server {KEPT} 127.0.0.1:{ports[KEPT]} check observe layer4 error-limit 3 "
        "on-error mark-down\n"
        f"    server {OTHER} 127.0.0.1:{ports[OTHER]} check observe layer4 error-limit 3 "
        "on-error mark-down\n"
        f"    server {FALLBACK} 127.0.0.1:{ports[FALLBACK]} check backup\n"
    )
    return config


@contextlib.contextmanager
def front_door_of_two(
    tmp_path: Path, environment: dict[str, str], realtime: str
) -> Iterator[tuple[int, Servers]]:
    servers, port = Servers(), free_port()
    config = serve_shaped_config(tmp_path, port, servers.ports)
    try:
        with running_haproxy(config, port, {**environment, "TRIBUTARY_REALTIME_INGRESS": realtime}):
            yield port, servers
    finally:
        servers.close()


def post(priority: str | None = None) -> bytes:
    header = f"X-Priority: {priority}\r\n" if priority else ""
    return (
        f"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n{header}Connection: close\r\n"
        "Content-Length: 2\r\n\r\n{}"
    ).encode()


def answered_by(port: int, raw: bytes, count: int = 8) -> set[str]:
    names = set()
    for _ in range(count):
        status, _, body = exchange(port, raw)
        assert status == 200, (status, body)
        names.add(body.decode())
    return names


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return wrapper_environment(monkeypatch)


def test_realtime_goes_to_the_kept_replica_and_nothing_else_does(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    with front_door_of_two(tmp_path, environment, APP) as (port, _):
        assert answered_by(port, post("realtime")) == {KEPT}
        assert answered_by(port, post("normal")) == {OTHER}
        assert answered_by(port, post()) == {OTHER}
        assert answered_by(port, b"GET /v1/stats HTTP/1.1\r\nHost: x\r\n\r\n") == {OTHER}
        stats = b"GET /v1/stats HTTP/1.1\r\nHost: x\r\nX-Priority: realtime\r\n\r\n"
        assert answered_by(port, stats) == {KEPT}  # how to read the kept replica's view


def test_with_the_kept_replica_down_realtime_goes_to_the_others(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    with front_door_of_two(tmp_path, environment, APP) as (port, servers):
        servers.stop(KEPT)
        assert answered_by(port, post("realtime")) == {OTHER}
        assert answered_by(port, post("normal")) == {OTHER}


def test_with_the_others_down_the_rest_goes_to_the_fallback_not_the_kept_one(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    with front_door_of_two(tmp_path, environment, APP) as (port, servers):
        servers.stop(OTHER)
        # The first tries may fail over from the stopped replica by the retry; all are
        # answered, and none by the replica kept for realtime.
        assert KEPT not in answered_by(port, post("normal"), count=12)
        assert answered_by(port, post("realtime")) == {KEPT}


def test_an_app_not_named_balances_as_serve_wrote_it(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    with front_door_of_two(tmp_path, environment, "another-app") as (port, _):
        assert answered_by(port, post("normal"), count=12) == {KEPT, OTHER}
        assert answered_by(port, post("realtime"), count=12) == {KEPT, OTHER}


def test_the_patch_keeps_a_replica_only_with_two_or_more(tmp_path: Path) -> None:
    two = serve_shaped_config(tmp_path, 1, {KEPT: 2, OTHER: 3, FALLBACK: 4}).read_text()
    patched = front_door.patch_config(two, {}, realtime=frozenset({APP}))
    assert f"use-server {KEPT} if" in patched
    kept = next(line for line in patched.splitlines() if f"server {KEPT} " in line)
    assert kept.endswith(" weight 0")
    one = "\n".join(line for line in two.splitlines() if OTHER not in line)
    assert "use-server" not in front_door.patch_config(one, {}, realtime=frozenset({APP}))
    assert "use-server" not in front_door.patch_config(two, {})


def test_the_apps_come_from_the_environment() -> None:
    apps = front_door.realtime_apps({"TRIBUTARY_REALTIME_INGRESS": " tributary, other ,"})
    assert apps == frozenset({"tributary", "other"})
    assert front_door.realtime_apps({}) == frozenset()
