"""deployments/bin/haproxy-tributary: HAProxy's own errors in the API's JSON shape, on the
config Serve generates, and with the real HAProxy binary answering malformed HTTP. The
queue bounds are in test_front_door_queue.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments.launch import main as launch
from tests.parts.front_door_support import (
    ERRORS,
    exchange,
    free_port,
    front_door,
    running_haproxy,
    serve_generated_config,
    wrapper_environment,
)


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    return wrapper_environment(monkeypatch)


@pytest.mark.parametrize("path", sorted(ERRORS.glob("*.http")), ids=lambda p: p.stem)
def test_every_error_file_is_a_raw_json_error_response(path: Path) -> None:
    raw = path.read_bytes()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *headers = head.decode().split("\r\n")
    assert status_line.startswith(f"HTTP/1.1 {path.stem} ")
    fields = dict(line.lower().split(": ", 1) for line in headers)
    assert fields["content-type"] == "application/json"
    assert int(fields["content-length"]) == len(body)
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert len(raw) < 16384  # HAProxy keeps an error file in one buffer (tune.bufsize)
    if path.stem in {"429", "502", "503"}:
        assert int(fields["retry-after"]) >= 1


def test_the_patch_puts_ours_in_defaults_in_place_of_serves(tmp_path: Path) -> None:
    original = serve_generated_config(tmp_path).read_text()
    assert "500.http" in original  # Serve's plain-text 500 for 502/503/504
    patched = front_door.patch_config(original, front_door.error_files())
    defaults = patched.split("\ndefaults\n", 1)[1].split("\nfrontend ", 1)[0]
    lines = [line.split() for line in defaults.splitlines() if "errorfile" in line]
    assert sorted(code for _, code, _ in lines) == sorted(p.stem for p in ERRORS.glob("*.http"))
    assert all(Path(file).parent == ERRORS for _, _, file in lines)
    assert "500.http" not in patched.replace(str(ERRORS / "500.http"), "")


@pytest.mark.parametrize("request_log", [False, True], ids=["as launched", "request log on"])
def test_haproxy_accepts_the_patched_serve_config(
    tmp_path: Path, environment: dict[str, str], request_log: bool
) -> None:
    config = serve_generated_config(tmp_path, request_log)
    assert ("format rfc5424" in config.read_text()) is request_log
    checked = subprocess.run(
        [environment["RAY_SERVE_HAPROXY_BINARY_PATH"], "-c", "-f", str(config)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    # Rewritten beside Serve's file on each start or reload, not piling up elsewhere.
    assert (tmp_path / "haproxy.tributary.cfg").is_file()


def test_the_wrapper_refuses_to_guess_the_real_binary() -> None:
    environment = {k: v for k, v in os.environ.items() if k != "TRIBUTARY_HAPROXY_BINARY"}
    environment["TRIBUTARY_PYTHON"] = sys.executable
    result = subprocess.run(
        [str(launch.HAPROXY_WRAPPER), "-v"], env=environment, capture_output=True, text=True
    )
    assert result.returncode != 0 and "TRIBUTARY_HAPROXY_BINARY" in result.stderr


def test_the_wrapper_turns_splicing_off() -> None:
    arguments = front_door.haproxy_arguments(["-db", "-sf", "12"], {})
    assert arguments == ["-dS", "-db", "-sf", "12"]


def test_a_config_it_cannot_patch_in_place_is_copied_into_the_instances_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E.g. `-f /dev/stdin`: the copy goes where the launcher's instance keeps its files
    (deployments/launch/paths.py), so a clean stop removes it, not into the shared /tmp."""
    monkeypatch.setenv("TRIBUTARY_INSTANCE_DIR", str(tmp_path))
    copied = front_door.patched_path("/dev/stdin")
    assert copied.parent == tmp_path and copied.name.startswith("haproxy-tributary-")


SERVE_BACKPRESSURE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 35\r\nretry-after: 1\r\n\r\nRequest dropped due to backpressure"
)
APP_SHED_BODY = (
    b'{"error":{"message":"shed","type":"overloaded_error","param":null,"code":"queue_full"}}'
)
APP_SHED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
    b"retry-after: 3\r\ncontent-length: "
    + str(len(APP_SHED_BODY)).encode()
    + b"\r\n\r\n"
    + APP_SHED_BODY
)


class Backend:
    """A backend that answers garbage (HAProxy: 502) or never answers (504)."""

    def __init__(self, reply: bytes | None) -> None:
        self.reply = reply
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.port = int(self.listener.getsockname()[1])
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            connection.recv(65536)
            if self.reply is None:
                self.held.append(connection)
            else:
                connection.sendall(self.reply)
                connection.close()

    def close(self) -> None:
        self.listener.close()
        for connection in self.held:
            connection.close()


@pytest.fixture
def haproxy(tmp_path: Path, environment: dict[str, str]) -> Iterator[int]:
    """The real HAProxy through the wrapper: /dead has no live server, /garbage one that
    answers garbage, /silent one that never answers, /busy Serve's plain-text
    back-pressure 503, /shed the app's own JSON 503."""
    port = free_port()
    garbage, silent = Backend(b"NOT HTTP\r\n\r\n"), Backend(None)
    busy, shed = Backend(SERVE_BACKPRESSURE), Backend(APP_SHED)
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        "global\n    maxconn 64\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n"
        "    timeout server 1s\n    timeout http-request 1s\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n"
        "    use_backend garbage if { path /garbage }\n"
        "    use_backend silent if { path /silent }\n"
        "    use_backend busy if { path /busy }\n"
        "    use_backend shed if { path /shed }\n"
        "    default_backend dead\n"
        "backend dead\n    server s 127.0.0.1:1\n"
        f"backend garbage\n    server s 127.0.0.1:{garbage.port}\n"
        f"backend silent\n    server s 127.0.0.1:{silent.port}\n"
        f"backend busy\n    server s 127.0.0.1:{busy.port}\n"
        f"backend shed\n    server s 127.0.0.1:{shed.port}\n"
    )
    try:
        with running_haproxy(config, port, environment):
            yield port
    finally:
        for backend in (garbage, silent, busy, shed):
            backend.close()


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/dead", 503, "not_ready"),
        ("/garbage", 502, "bad_gateway"),
        ("/silent", 504, "gateway_timeout"),
    ],
)
def test_haproxys_own_5xx_are_json_with_their_real_status(
    haproxy: int, path: str, status: int, code: str
) -> None:
    got, headers, body = exchange(haproxy, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert got == status and headers["content-type"] == "application/json"
    assert json.loads(body)["error"]["code"] == code
    if status != 504:
        assert int(headers["retry-after"]) >= 1


def test_serves_plain_text_backpressure_becomes_the_json_overloaded_error(haproxy: int) -> None:
    status, headers, body = exchange(haproxy, b"GET /busy HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 503 and headers["content-type"] == "application/json"
    assert int(headers["retry-after"]) >= 1
    assert json.loads(body)["error"] == {
        "message": "The server is at capacity; retry shortly.",
        "type": "overloaded_error",
        "param": None,
        "code": "server_overloaded",
    }


def test_the_apps_own_json_503_passes_unchanged(haproxy: int) -> None:
    status, headers, body = exchange(haproxy, b"GET /shed HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status == 503 and headers["retry-after"] == "3"
    assert body == APP_SHED_BODY


@pytest.mark.parametrize(
    "raw",
    [
        b"GARBAGE\r\n\r\n",
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n",
    ],
    ids=["request-line", "content-length", "64k-header"],
)
def test_malformed_http_is_a_400_from_haproxys_parser(haproxy: int, raw: bytes) -> None:
    # HAProxy 2.8 answers errors its HTTP/1 parser finds before a request exists with its
    # built-in page, whatever the errorfiles say (mux_h1.c, h1_send_error): a 400 that
    # closes the connection, never a 5xx or a hang. Should a newer HAProxy use the
    # errorfile, this test says so by failing; then assert the JSON body instead.
    status, headers, _ = exchange(haproxy, raw)
    assert status == 400 and headers["connection"] == "close"
    assert headers["content-type"] == "text/html"
