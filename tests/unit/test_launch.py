"""deployments.launch.main: Serve starts HAProxy through Tributary's wrapper, a taken metrics port
is refused before Ray starts (Ray itself would fail half a minute later with an
unrelated-sounding timeout) while one a stopped run left in TIME_WAIT is not, and the
open-files limit is raised for HAProxy or the launch stops with one line saying what to
raise. The wrapper itself: test_front_door.py."""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from deployments.launch import main as launch

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


def test_haproxy_modes_start_haproxy_through_the_wrapper(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    environment = launch.haproxy_environment()
    wrapper = environment["RAY_SERVE_HAPROXY_BINARY_PATH"]
    assert wrapper == str(launch.HAPROXY_WRAPPER)
    assert os.access(wrapper, os.X_OK)
    assert os.access(environment["TRIBUTARY_HAPROXY_BINARY"], os.X_OK)


def test_haproxy_modes_turn_serves_per_request_log_off_and_the_proxy_mode_has_none() -> None:
    # Applied with setdefault in main(): an operator's RAY_SERVE_HAPROXY_METRICS_ENABLED wins.
    for mode, environment in launch.SERVE_MODES.items():
        haproxy = environment.get("RAY_SERVE_ENABLE_HA_PROXY") == "1"
        assert (environment.get("RAY_SERVE_HAPROXY_METRICS_ENABLED") == "0") is haproxy, mode


def test_an_operators_own_haproxy_binary_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", "/opt/haproxy/bin/haproxy")
    assert launch.haproxy_environment() == {}


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


def test_a_low_soft_fd_limit_is_raised_for_haproxy() -> None:
    def low_soft_limit() -> None:
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))

    code = (
        "import resource; from deployments.launch import main as launch; "
        "print(launch.fd_limit_problem(4096), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=low_soft_limit,
    )
    # 10,278 is what HAProxy 2.8 asked for with Serve's config at maxconn 4096.
    assert result.stdout.split() == ["None", str(launch.haproxy_fd_need(4096))], result.stderr
    assert launch.haproxy_fd_need(4096) >= 10278


def test_a_hard_fd_limit_too_low_for_haproxy_is_one_clear_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = {"now": (1024, 4096)}

    def setrlimit(kind: int, value: tuple[int, int]) -> None:
        if value[1] > limits["now"][1]:
            raise ValueError("not allowed to raise maximum limit")
        limits["now"] = value

    monkeypatch.setattr(resource, "getrlimit", lambda kind: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    problem = launch.fd_limit_problem(4096)
    assert problem is not None and "\n" not in problem
    assert "hard 4096" in problem and "ulimit -n 10368" in problem and "--mode proxy" in problem
    assert launch.fd_limit_problem(1024) is None  # 2,688 fits under 4096: the soft one rises
    assert limits["now"] == (launch.haproxy_fd_need(1024), 4096)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("capsh") is None,
    reason="root with capsh: a process that may not raise its hard limit",
)
def test_the_launcher_stops_with_one_line_before_ray_starts() -> None:
    # Nothing may start Ray here: were the check to pass, RAY_ADDRESS names no cluster and
    # ray.init fails instead of starting one.
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RAY_SERVE")},
        "RAY_ADDRESS": "127.0.0.1:9",
    }
    script = (
        "ulimit -Sn 1024 && ulimit -Hn 4096 && exec capsh --drop=cap_sys_resource -- -c "
        f"'exec {sys.executable} -m deployments.launch --metrics-port=0'"
    )
    result = subprocess.run(
        ["sh", "-c", script], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert "hard 4096" in line and "ulimit -n 10368" in line and "--mode proxy" in line


def test_haproxy_side_ports_keep_their_defaults_when_free_and_move_when_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launch, "_port_is_free", lambda port: port != 9101)
    chosen = launch.haproxy_side_ports({})
    assert chosen["RAY_SERVE_HAPROXY_STATS_PORT"] == "8404"
    moved = int(chosen["RAY_SERVE_HAPROXY_METRICS_PORT"])
    assert moved in launch.SPARE_PORTS  # never from the range Ray's own components draw on


def test_haproxy_side_ports_an_operator_chose_are_left_alone() -> None:
    environ = {"RAY_SERVE_HAPROXY_METRICS_PORT": "9200", "RAY_SERVE_HAPROXY_STATS_PORT": "9300"}
    environ |= {"RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": "9400"}
    environ |= {"RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": "9401"}
    assert launch.haproxy_side_ports(environ) == {}


def test_a_second_server_never_shares_the_fallback_proxy_port(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Serve's fallback proxy binds with SO_REUSEPORT: sharing its port would not fail, it
    # would split each server's fallback connections between the two. A taken one moves.
    monkeypatch.setattr(launch, "_port_is_free", lambda port: port not in (8500, 9500))
    chosen = launch.haproxy_side_ports({})
    assert chosen["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"] != "8500"
    assert chosen["RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"] != "9500"
    assert int(chosen["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"]) in launch.SPARE_PORTS
