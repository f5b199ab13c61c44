"""A Ray cluster of several nodes on this one machine, for the multi-node tests.

Each node is a `ray start --block` process in a session of its own: every process of that
node (GCS, raylet, agents, Serve actors, replicas) is its descendant and shares its process
group, so one node can be killed outright, as a lost machine would be, and the others live
on. Nothing here touches another Ray instance on the machine: ports are picked free, the
temp dir is private, and every process is addressed by pid or by its node's process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.server import ROOT, descendants, free_port

_HANDED_OUT: set[int] = set()


def unique_free_port() -> int:
    """A free port no other call in this process has handed out: the kernel may give
    the same free port to two probes in a row, and Ray refuses to start a node whose
    components share one ("is trying to use a port number ... used by other
    components")."""
    while True:
        port = free_port()
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


RAY = Path(sys.executable).with_name("ray")
SERVE = Path(sys.executable).with_name("serve")


@dataclass
class Node:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def pids(self) -> set[int]:
        return {self.process.pid, *descendants(self.process.pid)}

    def kill(self) -> None:
        """SIGKILL to every process of the node at once: no goodbye to the GCS, just as
        when a machine loses power or a pod is evicted."""
        pids = self.pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        # Ray's workers run in process groups of their own: each one by pid too.
        signal_all(pids, signal.SIGKILL)
        self.process.wait(timeout=10)
        wait_gone(pids, 10)


@dataclass
class LocalCluster:
    workdir: Path
    # Token auth, as Ray's own default for new clusters, with a token private to this
    # cluster: nothing is read from or written to ~/.ray.
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    gcs_port: int = field(default_factory=unique_free_port)
    dashboard_port: int = field(default_factory=unique_free_port)
    nodes: list[Node] = field(default_factory=list)
    # Short: Ray's Unix socket paths live under it and must stay under ~100 characters.
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="trib-")))

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            # The replicas import this checkout's `deployments`, whatever is installed.
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
        )
        return env

    def start_node(self, name: str, num_cpus: int, resources: dict[str, float]) -> Node:
        head = not self.nodes
        ports = {
            "node-manager-port": unique_free_port(),
            "object-manager-port": unique_free_port(),
            "metrics-export-port": unique_free_port(),
            "dashboard-agent-listen-port": unique_free_port(),
            "dashboard-agent-grpc-port": unique_free_port(),
            "runtime-env-agent-port": unique_free_port(),
        }
        if head:
            ports |= {
                "port": self.gcs_port,
                "dashboard-port": self.dashboard_port,
                "ray-client-server-port": unique_free_port(),
            }
        args = [
            str(RAY),
            "start",
            "--block",
            "--disable-usage-stats",
            # Loopback only: the cluster's traffic never leaves this machine.
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus}",
            "--num-gpus=0",
            f"--resources={json.dumps(resources)}",
            "--object-store-memory=200000000",
            *(f"--{flag}={port}" for flag, port in ports.items()),
        ]
        if head:
            args += ["--head", "--include-dashboard=true", f"--temp-dir={self.temp_dir}"]
        else:
            args.append(f"--address=127.0.0.1:{self.gcs_port}")
        log = self.workdir / f"{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                args,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(),
                start_new_session=True,  # its own process group: the node, and only it
            )
        node = Node(name, process, log)
        self.nodes.append(node)
        self._wait_started(node)
        return node

    def _wait_started(self, node: Node, timeout_s: float = 90) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if node.process.poll() is not None:
                raise RuntimeError(f"{node.name} exited:\n{node.log.read_text()[-3000:]}")
            if "Ray runtime started" in node.log.read_text(errors="replace"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"{node.name} did not start:\n{node.log.read_text()[-3000:]}")

    def serve_cli(self, *args: str, timeout_s: float = 120) -> str:
        done = subprocess.run(
            [str(SERVE), *args, "--address", self.dashboard_url],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=self.env(),
            cwd=self.workdir,
        )
        if done.returncode != 0:
            raise RuntimeError(f"serve {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def deploy(self, config: dict[str, Any]) -> None:
        path = self.workdir / "serve_config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.serve_cli("deploy", str(path))

    def replicas(self, app: str, deployment: str) -> list[dict[str, Any]]:
        """Serve's view of a deployment's replicas (state, pid, node) from the dashboard's
        REST API."""
        response = httpx.get(
            f"{self.dashboard_url}/api/serve/applications/",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=10,
        )
        response.raise_for_status()
        apps = response.json().get("applications", {})
        deployments = apps.get(app, {}).get("deployments", {})
        return deployments.get(deployment, {}).get("replicas", [])

    def stop(self, grace_s: float = 5) -> set[int]:
        """SIGTERM to every process of every node (what `ray stop` sends), SIGKILL to what
        is left after `grace_s`; returns the pids that outlived even that. Nothing here
        needs a graceful exit: the cluster's state goes with its temp dir."""
        pids = {pid for node in self.nodes for pid in node.pids()}
        signal_all(pids, signal.SIGTERM)
        wait_gone(pids, grace_s)
        for node in self.nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.process.pid, signal.SIGKILL)
        signal_all(pids, signal.SIGKILL)
        for node in self.nodes:
            node.process.wait(timeout=10)
        wait_gone(pids, 10)
        self.nodes.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return running_pids(pids)


def running_pids(pids: set[int]) -> set[int]:
    """The pids that still run: a zombie has exited and only waits for its parent."""
    found = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in {"Z", "X"}:
            found.add(pid)
    return found


def signal_all(pids: set[int], signum: int) -> None:
    for pid in running_pids(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def wait_gone(pids: set[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while running_pids(pids) and time.monotonic() < deadline:
        time.sleep(0.2)


def running(replicas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in replicas if r.get("state") == "RUNNING"]


def wait_for(what: str, check: Any, timeout_s: float, interval_s: float = 1.0) -> Any:
    """Polls `check()` until it returns something truthy, which it returns."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            last = check()
            if last:
                return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")
