"""deployments.launch: Serve starts HAProxy through the no-splice wrapper, and a taken
metrics port is refused before Ray starts (Ray itself would fail half a minute later with an
unrelated-sounding timeout)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deployments import launch

ROOT = Path(__file__).resolve().parents[2]


def test_a_taken_metrics_port_is_refused_at_once_naming_the_port() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "deployments.launch", f"--metrics-port={port}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"port {port} for Ray's metrics is in use" in result.stderr
    assert "METRICS_PORT" in result.stderr


def test_haproxy_modes_start_haproxy_through_the_nosplice_wrapper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    environment = launch.haproxy_environment()
    wrapper = environment["RAY_SERVE_HAPROXY_BINARY_PATH"]
    assert wrapper == str(launch.NOSPLICE_WRAPPER)
    assert os.access(wrapper, os.X_OK)
    assert os.access(environment["TRIBUTARY_HAPROXY_BINARY"], os.X_OK)


def test_an_operators_own_haproxy_binary_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", "/opt/haproxy/bin/haproxy")
    assert launch.haproxy_environment() == {}


def test_the_wrapper_runs_the_real_haproxy_with_splicing_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    environment = {**os.environ, **launch.haproxy_environment()}
    # `-dS` must be accepted next to Serve's own arguments; -c checks a config and exits
    # without binding anything.
    config = (
        "defaults\n    mode http\n    option splice-request\nfrontend f\n    bind 127.0.0.1:18999\n"
    )
    checked = subprocess.run(
        [environment["RAY_SERVE_HAPROXY_BINARY_PATH"], "-c", "-f", "/dev/stdin"],
        input=config,
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    version = subprocess.run(
        [environment["RAY_SERVE_HAPROXY_BINARY_PATH"], "-vv"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert "HAProxy version" in version.stdout


def test_the_wrapper_refuses_to_guess_the_real_binary() -> None:
    environment = {k: v for k, v in os.environ.items() if k != "TRIBUTARY_HAPROXY_BINARY"}
    result = subprocess.run(
        [str(launch.NOSPLICE_WRAPPER), "-v"], env=environment, capture_output=True, text=True
    )
    assert result.returncode != 0 and "TRIBUTARY_HAPROXY_BINARY" in result.stderr


def _time_wait_port() -> int:
    """A port whose only trace is a TIME_WAIT connection: the server side closed first, as
    a metrics server does after answering a scrape. Like every HTTP server (Ray's metrics
    one included), it sets SO_REUSEADDR, which its connections inherit."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    server.close()
    accepted.close()  # the active close: this side's socket goes to TIME_WAIT
    client.recv(1)  # sees the FIN
    client.close()
    return port


def test_a_port_left_in_time_wait_by_a_stopped_run_is_free() -> None:
    port = _time_wait_port()
    # What the old probe did, a bind without SO_REUSEADDR, is refused by TIME_WAIT.
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("", port))
    assert launch._port_is_free(port)


def test_a_port_with_a_listener_is_taken() -> None:
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("", 0))
        holder.listen()
        assert not launch._port_is_free(holder.getsockname()[1])
