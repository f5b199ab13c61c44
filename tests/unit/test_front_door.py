"""deployments/bin/haproxy-tributary: HAProxy's own errors in the API's JSON shape, on the
config Serve generates, and with the real HAProxy binary answering malformed HTTP."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments import launch

ROOT = Path(__file__).resolve().parents[2]
ERRORS = ROOT / "deployments" / "static" / "errors"


def _load_front_door():  # type: ignore[no-untyped-def]
    path = ROOT / "deployments" / "bin" / "haproxy_front_door.py"
    spec = importlib.util.spec_from_file_location("haproxy_front_door", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


front_door = _load_front_door()


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    return {**os.environ, **launch.haproxy_environment()}


def serve_generated_config(directory: Path) -> Path:
    """The config Serve itself writes for one app with one replica."""
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig

    config = HAProxyConfig(
        socket_path=str(directory / "admin.sock"),
        server_state_base=str(directory),
        server_state_file=str(directory / "server-state"),
        metrics_socket_path=str(directory / "metrics.sock"),
    )
    backend = BackendConfig(
        name="default",
        path_prefix="/",
        servers=[ServerConfig(name="r1", host="127.0.0.1", port=1)],
        app_name="default",
    )
    api = HAProxyApi(config, {"default": backend}, config_file_path=str(directory / "haproxy.cfg"))
    api._generate_config_file_internal()
    return directory / "haproxy.cfg"


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


def test_haproxy_accepts_the_patched_serve_config(
    tmp_path: Path, environment: dict[str, str]
) -> None:
    config = serve_generated_config(tmp_path)
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    port = _free_port()
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


@contextlib.contextmanager
def running_haproxy(config: Path, port: int, environment: dict[str, str]) -> Iterator[None]:
    """The real HAProxy, through the wrapper, on `config`, until the block ends."""
    process = subprocess.Popen(
        [environment["RAY_SERVE_HAPROXY_BINARY_PATH"], "-db", "-f", str(config)],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "HAProxy did not start"
                time.sleep(0.05)
        yield
    finally:
        process.terminate()
        process.wait(timeout=10)


def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as connection:
        connection.sendall(raw)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer:
                head, _, body = answer.partition(b"\r\n\r\n")
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                if length and len(body) >= int(length.group(1)):
                    break
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *headers = head.decode().split("\r\n")
    fields = dict(line.lower().split(": ", 1) for line in headers)
    return int(status_line.split()[1]), fields, body


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
    port, backend = _free_port(), OneAtATime()
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        "global\n    maxconn 64\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 30s\n"
        "    timeout server 30s\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n    default_backend ingress\n"
        f"backend ingress\n    server s 127.0.0.1:{backend.port}\n"
    )
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
    assert (bounds.ingress_maxconn, bounds.queue, bounds.queue_timeout_s) == (8, 3, 30)
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
