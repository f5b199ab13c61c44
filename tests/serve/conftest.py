"""Starts the real application once per session: `python -m deployments.launch` (what
`make serve` runs) on a config derived from serve_config.yaml, on a free port, with a
second, strict copy of MiniLM (`truncate: false`). Stops it with Ctrl-C, as a user would,
and checks that the Ray instance it started is gone."""

from __future__ import annotations

import copy
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MODEL = "all-MiniLM-L6-v2"
STRICT_MODEL = "minilm-strict"
STARTUP_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_config(port: int) -> dict:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = port
    args = config["applications"][0]["args"]
    strict = copy.deepcopy(args["embedding_models"][0])
    strict.update(name=STRICT_MODEL, truncate=False, torch_threads=1)
    strict["deployment"]["ray_actor_options"]["num_cpus"] = 0.5
    args["embedding_models"].append(strict)
    return config


class Server:
    def __init__(self, port: int, process: subprocess.Popen, log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.process = process
        self.log = log


def _wait_until_healthy(server: Server) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{server.log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not healthy in {STARTUP_TIMEOUT_S}s:\n{server.log.read_text()}")


def descendants(pid: int) -> set[int]:
    """Every live process below `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


def stop_like_ctrl_c(process: subprocess.Popen, timeout_s: float = 60) -> set[int]:
    """Sends SIGINT, waits, and returns the processes it started that outlived it."""
    started = descendants(process.pid)
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + 30
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.5)
    leftovers = alive(started)
    for pid in leftovers:  # never leave them running, even when the check fails
        os.kill(pid, signal.SIGKILL)
    return leftovers


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workdir = tmp_path_factory.mktemp("serve")
    config_path = workdir / "serve_config.yaml"
    port = free_port()
    config_path.write_text(yaml.safe_dump(test_config(port)))
    log = workdir / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "deployments.launch", str(config_path)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: a last-resort kill hits only it
        )
    server = Server(port, process, log)
    try:
        _wait_until_healthy(server)
        yield server
    finally:
        leftovers = stop_like_ctrl_c(process)
    # Checked after the tests so that it fails the session: Ctrl-C must leave nothing.
    assert not leftovers, f"processes outlived Ctrl-C: {sorted(leftovers)}"
