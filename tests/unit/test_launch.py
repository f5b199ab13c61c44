"""The launcher's HAProxy wrapper: Serve starts HAProxy through it, with splicing off."""

from __future__ import annotations

import os
import subprocess

import pytest

from deployments import launch


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
