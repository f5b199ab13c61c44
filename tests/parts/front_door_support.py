"""What the front-door tests share: the wrapper module, Serve's own generated config, and
the real HAProxy through the wrapper on a config of the test's own."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.server import free_port as free_port  # the front-door tests take it from here
from deployments.launch import main as launch

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


def wrapper_environment(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The environment the launcher gives HAProxy, with the wrapper as Serve's binary."""
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    return {**os.environ, **launch.haproxy_environment()}


def serve_generated_config(directory: Path, request_log: bool = False) -> Path:
    """The config Serve itself writes for one app with one replica; without its per-request
    log to Serve's HAProxy manager unless `request_log`, as the launcher serves it."""
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig

    config = HAProxyConfig(
        socket_path=str(directory / "admin.sock"),
        server_state_base=str(directory),
        server_state_file=str(directory / "server-state"),
        metrics_socket_path=str(directory / "metrics.sock"),
        metrics_enabled=request_log,
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


def one_server_config(directory: Path, port: int, server_port: int) -> Path:
    """A minimal HAProxy config: one frontend on `port`, one backend server on
    `server_port`, as the wrapper would patch Serve's."""
    config = directory / "haproxy.cfg"
    config.write_text(
        "global\n    maxconn 64\n"
        "defaults\n    mode http\n    timeout connect 1s\n    timeout client 30s\n"
        "    timeout server 30s\n"
        f"frontend f\n    bind 127.0.0.1:{port}\n    default_backend ingress\n"
        f"backend ingress\n    server s 127.0.0.1:{server_port}\n"
    )
    return config


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
