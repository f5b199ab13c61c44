"""Start and stop a Tributary server the way `make serve` does, for benchmarks and tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from deployments.core.process_tree import descendants
from deployments.launch.main import spare_port

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A free port outside the kernel's ephemeral range and Ray's worker ports: one the
    kernel hands out (bind to 0) can be taken as the local end of someone's outgoing
    connection before the server binds it (a CI run lost HAProxy's bind that way)."""
    return spare_port()


def load_config(path: Path = ROOT / "serve_config.yaml") -> dict:
    return yaml.safe_load(path.read_text())


def embedder_only_config() -> dict:
    """serve_config.yaml's main app with its embedding model alone: a server that starts
    and stops in about 60 % of the time (two took 110 s, against 186), for what does not
    depend on the other models."""
    config = load_config()
    args = config["applications"][0]["args"]
    args["rerank_models"] = []
    args["generation_models"] = []
    return config


@dataclass
class Server:
    port: int
    process: subprocess.Popen
    log: Path
    config_path: Path
    metrics_port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        """Ray's Prometheus endpoint of this server's own Ray instance."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def dashboard_url(self) -> str:
        """The Ray dashboard of this server's own Ray instance (what `serve deploy` talks
        to); its port moves when 8265 is taken, so it is read from the log."""
        found = re.search(r"dashboard at \S*(http://[0-9.]+:[0-9]+)", self.log.read_text())
        if found is None:
            raise RuntimeError(f"no dashboard address in the log:\n{self.log_tail()}")
        return found.group(1)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


@contextmanager
def running_server(
    config: dict,
    workdir: Path,
    mode: str | None = None,
    startup_timeout_s: float = 240,
    metrics_port: int | None = None,
    root: Path = ROOT,
) -> Iterator[Server]:
    """Serves `config` on a free port; on exit stops it like Ctrl-C and raises if any
    process it started outlives that. Ray's metrics go to `metrics_port` (a restart test
    reuses one), else to a free port. `root` is the checkout whose code serves."""
    server = launch(config, workdir, ["--mode", mode] if mode else [], metrics_port, root=root)
    try:
        wait_until_healthy(server, startup_timeout_s)
        yield server
    finally:
        leftovers = stop_like_ctrl_c(server.process)
    if leftovers:
        raise RuntimeError(f"processes outlived Ctrl-C: {sorted(leftovers)}")


def launch(
    config: dict,
    workdir: Path,
    arguments: list[str],
    metrics_port: int | None = None,
    environment: dict[str, str] | None = None,
    root: Path = ROOT,
) -> Server:
    """Starts `python -m deployments.launch` of checkout `root` on `config` with a free
    HTTP port, without waiting; its output goes to workdir/serve.log."""
    config = {**config, "http_options": {**config.get("http_options", {}), "port": free_port()}}
    config = with_batch_store(config, workdir / "batches")
    if metrics_port is None:
        metrics_port = free_port()  # never 8080: a `make serve` may be running beside us
    config_path = workdir / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log = workdir / "serve.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deployments.launch",
                *arguments,
                f"--metrics-port={metrics_port}",
                str(config_path),
            ],
            cwd=root,
            stdout=out,
            stderr=subprocess.STDOUT,
            # Its own process group, so that a last-resort kill hits only it; in the caller's
            # session, not a new one: with kernel.sched_autogroup_enabled (the default on
            # most distributions) a session is a scheduling group of its own, weighed as one
            # process at niceness 0 against the caller's, and a load generator beside the
            # server then waited up to a second for a core behind replicas that Ray starts
            # at niceness 15 so that they yield to the machine's other work
            # (docs/reliability.md, "The load generator's lag, traced").
            process_group=0,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(environment or {})},
        )
    return Server(config["http_options"]["port"], process, log, config_path, metrics_port)


def with_batch_store(config: dict, path: Path) -> dict:
    """The config with its Batch API store under `path` where it names none, so a test's or
    a benchmark's server never shares the user's default store with another server."""
    apps = []
    for app in config.get("applications", []):
        args = app.get("args", {})
        batches = args.get("batches", {})
        if app.get("import_path") == "deployments.app:build_app" and not batches.get("path"):
            args = {**args, "batches": {**batches, "path": str(path)}}
        apps.append({**app, "args": args})
    return {**config, "applications": apps}


def deploy(server: Server, config: dict, path: Path, timeout_s: float = 120) -> None:
    """`serve deploy` of a whole config onto the running server, as an operator would;
    raises with the CLI's output if it refuses. The server's own batch store stays, as
    `launch` gave it: another path would change the app's arguments and restart it."""
    config = with_batch_store(config, server.config_path.parent / "batches")
    path.write_text(yaml.safe_dump(config))
    serve_cli = Path(sys.executable).with_name("serve")
    deployed = subprocess.run(
        [str(serve_cli), "deploy", str(path), "--address", server.dashboard_url()],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        # The local Ray instance has token auth on; the CLI sends the token only in
        # token mode (it reads ~/.ray/auth_token, which that instance wrote).
        env={**os.environ, "RAY_AUTH_MODE": "token"},
    )
    if deployed.returncode != 0:
        raise RuntimeError(f"serve deploy failed:\n{deployed.stdout}{deployed.stderr}")


def wait_until_healthy(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"server exited early:\n{server.log_tail()}")
        try:
            if httpx.get(f"{server.url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not healthy within {timeout_s}s:\n{server.log_tail()}")


def alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


def stop_like_ctrl_c(process: subprocess.Popen, timeout_s: float = 60) -> set[int]:
    """Sends SIGINT, waits, and returns the processes it had started that outlived it
    (after killing them, so that a failed check leaves nothing running)."""
    return stop_process(process, lambda: process.send_signal(signal.SIGINT), timeout_s)


def stop_process(
    process: subprocess.Popen,
    ask: Callable[[], None],
    timeout_s: float = 60,
    settle_s: float = 30,
) -> set[int]:
    """`ask` the process (which leads its own group) to stop, wait, SIGKILL the group if it
    does not; then the processes it had started that outlived it, killed."""
    started = descendants(process.pid)
    ask()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + settle_s
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftovers = alive(started)
    for pid in leftovers:
        os.kill(pid, signal.SIGKILL)
    return leftovers
