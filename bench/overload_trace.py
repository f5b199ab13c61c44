"""The overload test's shape, every request traced: where a slow answer or refusal spent its time.

`tests/reliability/test_overload.py` measures each latency from when the request was due,
so that a client that falls behind still charges the wait to the server. That is the right
charge for a goal and no help in finding a tail: on two cores shared with the server the
load generator itself can fall a second behind. Here every request keeps three times: due,
sent (the client's lag is sent - due) and answered (the server's part is answered - sent),
and every refusal says who refused it: HAProxy's front door (docs/operations.md, "Refusing
at the front door") or the ingress's admission.

The load: capacity by the test's closed loop (64 single-text clients), then normal-class
single texts at 2x that, batch-class at 0.5x and a realtime trickle of 10 a second, open
loop, for --seconds. Reported per class and outcome: p50/p90/p99 of the total, the lag and
the server's part; goodput (texts answered within their class's target, over capacity) over
the whole run and after --settle-s; and, second by second, the start of the flood.

    .venv/bin/python -m bench.overload_trace                     # 60 s at 2x
    .venv/bin/python -m bench.overload_trace --seconds 600 --json /tmp/trace.json
    .venv/bin/python -m bench.overload_trace --no-shared-passes   # each class's passes alone
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.llm_workload import percentile
from bench.loadgen import embedding_bodies, run_closed_loop
from bench.open_loop import TracedRequest, run_open_loop
from bench.process_cpu import cores_between, read_cpu
from bench.server import load_config, running_server
from bench.texts import sentences
from deployments.bin.haproxy_front_door import FRONT_REFUSAL
from deployments.config import AppConfig
from deployments.core.priority import PriorityName

# The overload test's load (tests/reliability/test_overload.py takes it from here).
EMBEDDER = "all-MiniLM-L6-v2"
CALIBRATION_CLIENTS = 64
CALIBRATION_S = 15.0
BATCH_SHARE = 0.5  # of the capacity, beside normal's 2x
REALTIME_PER_S = 10.0
# Past the normal class's 60 s deadline: a request still unanswered then was lost.
REQUEST_TIMEOUT_S = 90.0
RESULTS = Path(__file__).parent / "results"
_FRONT_DOOR = FRONT_REFUSAL.encode()[:40]


def outcome(request: TracedRequest) -> str:
    if request.status == 200:
        return "answered"
    if request.status in (429, 503):
        return "front door" if request.refusal.startswith(_FRONT_DOOR) else "ingress"
    return "other" if request.status else "no answer"


def _spread_ms(values: list[float]) -> dict[str, float]:
    # `split` makes no empty groups: every percentile here has values.
    return {f"p{q}": round(1e3 * percentile(values, q), 1) for q in (50, 90, 99)}


def split(trace: Iterable[TracedRequest]) -> dict[str, dict[str, Any]]:
    """Per outcome: how many, and the p50/p90/p99 of the total, the lag and the server.
    "refused" holds every refusal, whoever made it: the overload test's measure."""
    groups: dict[str, list[TracedRequest]] = {}
    for request in trace:
        groups.setdefault(outcome(request), []).append(request)
    refused = groups.get("front door", []) + groups.get("ingress", [])
    if refused:
        groups["refused"] = refused
    return {
        name: {
            "count": len(group),
            "total_ms": _spread_ms([r.answered - r.due for r in group]),
            "lag_ms": _spread_ms([r.sent - r.due for r in group]),
            "server_ms": _spread_ms([r.answered - r.sent for r in group]),
        }
        for name, group in sorted(groups.items())
    }


def within_target(trace: Iterable[TracedRequest], target_s: float) -> int:
    return sum(1 for r in trace if r.status == 200 and r.answered - r.due <= target_s)


def goodput_share(
    traces: Mapping[str, list[TracedRequest]],
    targets_s: Mapping[str, float],
    capacity: float,
    start: float,
    end: float,
) -> float:
    """Requests due in [start, end) answered within their class's target, a second, over
    the capacity (single texts: a request is a text)."""
    good = sum(
        within_target([r for r in trace if start <= r.due < end], targets_s[label])
        for label, trace in traces.items()
    )
    return good / (end - start) / capacity if end > start and capacity > 0 else 0.0


def onset(trace: list[TracedRequest], start: float, seconds: float) -> list[dict[str, object]]:
    """Second by second from `start`: each outcome's count and its server part's p90."""
    rows = []
    for second in range(math.ceil(seconds)):
        due = [r for r in trace if start + second <= r.due < start + second + 1]
        row: dict[str, object] = {"second": second}
        for name, group in split(due).items():
            row[name] = {"count": group["count"], "server_p90_ms": group["server_ms"]["p90"]}
        rows.append(row)
    return rows


def config(front_door_headroom: float | None, shared_passes: bool = True) -> dict[str, Any]:
    loaded = load_config()
    args = loaded["applications"][0]["args"]
    if front_door_headroom is not None:
        args["ingress"]["admission"]["front_door_headroom"] = front_door_headroom
    if not shared_passes:
        for model in args["embedding_models"]:
            model.setdefault("batching", {})["shared_passes"] = False
    return loaded


def targets_ms() -> dict[PriorityName, float]:
    """Each class's latency target in serve_config.yaml."""
    args = load_config()["applications"][0]["args"]
    admission = AppConfig.model_validate(args).ingress.admission
    return {label: admission.target_ms(label) for label in ("realtime", "normal", "batch")}


@dataclass(frozen=True)
class TracedRun:
    capacity_req_per_s: float
    start: float  # when the 2x load began, on time.perf_counter()
    traces: dict[str, list[TracedRequest]]  # per class
    # Every second of the 2x load, what the ingress that takes normal and batch said of
    # its admission: the embedder's `predicted_wait` and HAProxy's shares.
    admission: list[dict[str, Any]]
    # The cores each part of the server took (bench/process_cpu.py) while capacity was
    # measured ("calibration") and during the 2x load ("overload"): whether the model or
    # the path around it had the machine. The load generator (this process) is one part:
    # on a small machine it shares the cores with the server, and 2.5x the requests a
    # second cost it more.
    cores_by_role: dict[str, dict[str, float]]


async def traced_overload(port: int, seconds: float) -> TracedRun:
    bodies = embedding_bodies(sentences(2000), 1, EMBEDDER, 256)
    roles_calibration = read_cpu(load_generator=os.getpid())
    closed = await run_closed_loop(
        "127.0.0.1",
        port,
        "/v1/embeddings",
        bodies,
        1,
        CALIBRATION_CLIENTS,
        CALIBRATION_S,
        warmup_s=2,
        progress=False,
        honor_retry_after=True,
    )
    capacity = closed.req_per_s
    by_role = {"calibration": cores_between(roles_calibration, read_cpu(os.getpid()))}
    rates = {"normal": 2 * capacity, "batch": BATCH_SHARE * capacity, "realtime": REALTIME_PER_S}
    traces: dict[str, list[TracedRequest]] = {label: [] for label in rates}
    start = time.perf_counter()
    roles_before = read_cpu(load_generator=os.getpid())
    admission: list[dict[str, Any]] = []
    sampler = asyncio.create_task(sample_admission(port, start, admission))
    await asyncio.gather(
        *(
            run_open_loop(
                "127.0.0.1",
                port,
                "/v1/embeddings",
                bodies,
                rate,
                seconds,
                warmup_s=0,
                headers={"X-Priority": label},
                request_timeout_s=REQUEST_TIMEOUT_S,
                trace=traces[label],
            )
            for label, rate in rates.items()
        )
    )
    by_role["overload"] = cores_between(roles_before, read_cpu(load_generator=os.getpid()))
    sampler.cancel()
    await asyncio.gather(sampler, return_exceptions=True)
    return TracedRun(capacity, start, traces, admission, by_role)


async def sample_admission(port: int, start: float, into: list[dict[str, Any]]) -> None:
    async with httpx.AsyncClient(timeout=5) as client:
        while True:
            await asyncio.sleep(1.0)
            try:
                stats = (await client.get(f"http://127.0.0.1:{port}/v1/stats")).json()
            except (httpx.HTTPError, ValueError):
                continue  # a second missed; the trace itself is what counts
            ingress = stats["models"][EMBEDDER]["ingress"]
            replica = stats["models"][EMBEDDER].get("replica") or {}
            into.append(
                {
                    "second": round(time.perf_counter() - start, 1),
                    "predicted_wait": ingress.get("predicted_wait"),
                    "front_door_shares": stats.get("front_door_shares"),
                    # The replica's passes so far, per class: how large they ran.
                    "passes": replica.get("classes"),
                    # Each targeted class's slot and the p99 of its last 64 answers.
                    "targets": replica.get("targets"),
                    # Whether each class's passes may carry a lower class's batches.
                    "slack": replica.get("slack"),
                }
            )


def passes_between(admission: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per class, the embedder's passes and the inputs they carried between the first and
    the last second sampled, and the mean inputs a pass: whether the model ran the large
    passes that its capacity was measured with, or small ones."""
    sampled = [a["passes"] for a in admission if a.get("passes")]
    if len(sampled) < 2:
        return {}
    first, last = sampled[0], sampled[-1]
    out: dict[str, dict[str, float]] = {}
    for label, counts in last.items():
        before = first.get(label, {})

        def grew(key: str, counts: dict[str, int] = counts, before: dict[str, int] = before) -> int:
            return counts.get(key, 0) - before.get(key, 0)

        passes, riders = grew("batches"), grew("riders_items")
        out[label] = {
            "passes": passes,
            "inputs": grew("items"),
            # Inputs of other waiting batches (its own class's too) its passes took along,
            # and its own that rode in a pass another batch led (batching.shared_passes).
            "riders": riders,
            "carried": grew("carried_items"),
            "mean_inputs": round((grew("items") + riders) / passes, 2) if passes else 0.0,
        }
    return out


def summarize(
    run: TracedRun, targets: Mapping[str, float], seconds: float, settle_s: float
) -> dict[str, object]:
    traces, start, capacity = run.traces, run.start, run.capacity_req_per_s
    end = start + seconds
    return {
        "capacity_req_per_s": round(capacity, 1),
        "seconds": seconds,
        "goodput_share": round(goodput_share(traces, targets, capacity, start, end), 3),
        "settle_s": settle_s,
        "goodput_share_after_settle": round(
            goodput_share(traces, targets, capacity, start + settle_s, end), 3
        ),
        "client_cores": {
            phase: roles.get("load generator", 0.0) for phase, roles in run.cores_by_role.items()
        },
        "cores_by_role": run.cores_by_role,
        "passes_under_load": passes_between(run.admission),
        "classes": {label: split(trace) for label, trace in traces.items()},
        "classes_after_settle": {
            label: split(r for r in trace if r.due >= start + settle_s)
            for label, trace in traces.items()
        },
        "onset_normal": onset(traces["normal"], start, min(settle_s, seconds)),
        "admission_each_second": run.admission,
    }


def print_classes(classes: Mapping[str, Mapping[str, Any]]) -> None:
    print("class     outcome      count   total p50/p90/p99 ms   lag p50/p99   server p50/p90/p99")
    for label, outcomes in classes.items():
        for name, g in outcomes.items():
            t, lag, s = g["total_ms"], g["lag_ms"], g["server_ms"]
            print(
                f"{label:9s} {name:11s} {g['count']:6d}   "
                f"{t['p50']:7.1f} {t['p90']:7.1f} {t['p99']:7.1f}   "
                f"{lag['p50']:5.1f} {lag['p99']:6.1f}   "
                f"{s['p50']:7.1f} {s['p90']:7.1f} {s['p99']:7.1f}"
            )


def print_summary(summary: Mapping[str, Any]) -> None:
    print(
        f"capacity {summary['capacity_req_per_s']} req/s; goodput {summary['goodput_share']}x"
        f" over the run, {summary['goodput_share_after_settle']}x after the first"
        f" {summary['settle_s']:g} s"
    )
    cores = summary.get("client_cores") or {}
    print(
        f"the load generator's CPU: {cores.get('calibration')} cores while capacity was"
        f" measured, {cores.get('overload')} under the 2x load"
    )
    by_role = summary.get("cores_by_role") or {}
    print("cores by part of the server: while capacity was measured / under the 2x load")
    calibration, overload = by_role.get("calibration", {}), by_role.get("overload", {})
    for name in sorted(set(calibration) | set(overload), key=lambda n: -overload.get(n, 0)):
        print(f"  {name:40s} {calibration.get(name, 0):6.3f} {overload.get(name, 0):6.3f}")
    for label, figures in (summary.get("passes_under_load") or {}).items():
        print(
            f"  the embedder's {label} passes under the 2x load: {figures['passes']},"
            f" {figures['mean_inputs']} inputs each ({figures.get('riders', 0)} of other"
            f" batches taken along; {figures.get('carried', 0)} of its own carried by others)"
        )
    print("the whole run:")
    print_classes(summary["classes"])
    print(f"after the first {summary['settle_s']:g} s:")
    print_classes(summary["classes_after_settle"])
    print("second  normal answered  aim   fit base/slope/spread   late ms  front door share")
    by_second = {round(row["second"]): row for row in summary["admission_each_second"]}
    for row in summary["onset_normal"]:
        second = row["second"]
        answered = row.get("answered", {}).get("count", 0)
        seen = by_second.get(second + 1, {})  # sampled at the end of the second
        wait = seen.get("predicted_wait") or {}
        aim = (wait.get("target_aim") or {}).get("normal", {}).get("aim")
        fit = (wait.get("fit") or {}).get("normal") or {}
        late = (wait.get("late_ms") or {}).get("normal")
        share = (seen.get("front_door_shares") or {}).get("embed_normal")
        line = "/".join(str(fit.get(k, "-")) for k in ("base_ms", "slope", "spread_ms"))
        print(f"{second:6d}  {answered:15d}  {aim!s:5}  {line:22s}  {late!s:7}  {share}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="of the 2x load")
    parser.add_argument("--settle-s", type=float, default=10.0, help="the start left out")
    parser.add_argument("--json", type=Path, help="where to write the summary")
    parser.add_argument(
        "--front-door-headroom",
        type=float,
        help="ingress.admission.front_door_headroom instead of serve_config.yaml's",
    )
    parser.add_argument(
        "--no-shared-passes",
        action="store_true",
        help="the embedder's batching.shared_passes off: each class's batches run alone",
    )
    args = parser.parse_args(argv)
    served = config(args.front_door_headroom, shared_passes=not args.no_shared_passes)
    with (
        tempfile.TemporaryDirectory(prefix="tributary-trace-") as work,
        running_server(served, Path(work)) as server,
    ):
        run = asyncio.run(traced_overload(server.port, args.seconds))
    targets_s = {label: ms / 1e3 for label, ms in targets_ms().items()}
    summary = summarize(run, targets_s, args.seconds, args.settle_s)
    summary["shared_passes"] = not args.no_shared_passes
    print_summary(summary)
    path = args.json or RESULTS / f"overload-trace-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
