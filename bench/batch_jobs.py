"""The Batch API on a running server: an N-text embedding batch's texts/s, and optionally
realtime single-text latency alone and while a batch runs (issue 29's measure).

    python -m bench.batch_jobs --url http://127.0.0.1:8000 --texts 100000 \
        --baseline-seconds 30 --realtime

Start the server first (`make serve`). A batch of one text per line goes through the
server's own pacing: texts/s is the whole batch, from its creation until it completed,
the upload excluded; --baseline-seconds first measures the served 8 clients x 32 texts
throughput it is compared with. With --realtime, a closed loop of single-text realtime requests runs
first alone, then while a second batch of the same size runs; their p99 is compared (the
batch must outlast the window: `batch_status_after` says whether it did; the second batch
is cancelled afterwards). A closed loop's p99 alone moves by tens of percent from one window
to the next on a shared machine, so --rounds N alternates the two N times (alone, then during a
fresh batch) and reports each round and the medians: the ratio is the median of the rounds'.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import orjson

from bench.loadgen import LoadResult, embedding_bodies, run_closed_loop
from bench.texts import sentences
from deployments.batch_cli import FINAL, BatchClient

POLL_S = 0.5


def batch_file(path: Path, texts: list[str], per_line: int, model: str) -> int:
    lines = 0
    with path.open("wb") as out:
        for start in range(0, len(texts), per_line):
            chunk = texts[start : start + per_line]
            body = {"model": model, "input": chunk[0] if per_line == 1 else chunk}
            line = {"custom_id": f"t{start}", "method": "POST", "url": "/v1/embeddings"}
            out.write(orjson.dumps({**line, "body": body}) + b"\n")
            lines += 1
    return lines


def start_batch(client: BatchClient, path: Path) -> str:
    uploaded = client.upload(path)
    body = {
        "input_file_id": uploaded["id"],
        "endpoint": "/v1/embeddings",
        "completion_window": "24h",
    }
    return str(client.json("POST", "/v1/batches", body)["id"])


def wait_done(client: BatchClient, batch_id: str) -> dict[str, Any]:
    while True:
        batch: dict[str, Any] = client.json("GET", f"/v1/batches/{batch_id}")
        if batch["status"] in FINAL:
            return batch
        time.sleep(POLL_S)


def wait_started(client: BatchClient, batch_id: str) -> None:
    while True:
        batch = client.json("GET", f"/v1/batches/{batch_id}")
        if batch["request_counts"]["completed"] > 0 or batch["status"] in FINAL:
            return
        time.sleep(0.1)


def realtime_loop(
    url: str, key: str | None, model: str, seconds: float, clients: int
) -> LoadResult:
    target = urlparse(url)
    headers = {"X-Priority": "realtime"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    bodies = embedding_bodies(sentences(500, seed=7), 1, model, 500)
    return asyncio.run(
        run_closed_loop(
            target.hostname or "127.0.0.1",
            target.port or 80,
            "/v1/embeddings",
            bodies,
            1,
            clients,
            seconds,
            progress=False,
            headers=headers,
        )
    )


def realtime_window(args: argparse.Namespace) -> dict[str, Any]:
    """One window of the realtime closed loop, as the command line sets it: its latencies."""
    result = realtime_loop(
        args.url, args.key, args.model, args.realtime_seconds, args.realtime_clients
    )
    return _latency(result)


def served_baseline(url: str, key: str | None, model: str, seconds: float) -> float:
    """Texts/s of 8 closed-loop clients sending 32 texts a request: the issue's yardstick."""
    target = urlparse(url)
    headers = {"Authorization": f"Bearer {key}"} if key else None
    bodies = embedding_bodies(sentences(4096, seed=11), 32, model, 128)
    result = asyncio.run(
        run_closed_loop(
            target.hostname or "127.0.0.1",
            target.port or 80,
            "/v1/embeddings",
            bodies,
            32,
            8,
            seconds,
            progress=False,
            headers=headers,
        )
    )
    return result.texts_per_s


def run_batch(client: BatchClient, path: Path, texts: int) -> dict[str, Any]:
    started = time.monotonic()
    batch_id = start_batch(client, path)
    created = time.monotonic()
    batch = wait_done(client, batch_id)
    took = time.monotonic() - created
    counts = batch["request_counts"]
    return {
        "batch": batch_id,
        "status": batch["status"],
        "completed_lines": counts["completed"],
        "failed_lines": counts["failed"],
        "upload_s": round(created - started, 2),
        "seconds": round(took, 2),
        "texts_per_s": round(texts / took, 1) if batch["status"] == "completed" else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_jobs")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", default=os.environ.get("TRIBUTARY_API_KEY"))
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument("--texts", type=int, default=100_000)
    parser.add_argument("--texts-per-line", type=int, default=1)
    parser.add_argument(
        "--baseline-seconds",
        type=float,
        default=0.0,
        help="first measure served 8 clients x 32 texts for this long (0: not)",
    )
    parser.add_argument("--realtime", action="store_true", help="also realtime p99 alone/during")
    parser.add_argument("--realtime-seconds", type=float, default=20.0)
    parser.add_argument("--realtime-clients", type=int, default=1)
    parser.add_argument(
        "--rounds", type=int, default=1, help="alone/during windows, alternated this many times"
    )
    args = parser.parse_args(argv)
    client = BatchClient(args.url, args.key)
    report: dict[str, Any] = {"texts": args.texts, "texts_per_line": args.texts_per_line}
    with tempfile.TemporaryDirectory() as workdir:
        path = Path(workdir) / "batch.jsonl"
        texts = sentences(args.texts, seed=29)
        report["lines"] = batch_file(path, texts, args.texts_per_line, args.model)
        if args.realtime:
            report["realtime_alone"] = realtime_window(args)
        if args.baseline_seconds > 0:
            baseline = served_baseline(args.url, args.key, args.model, args.baseline_seconds)
            report["served_8x32_texts_per_s"] = round(baseline, 1)
        report["batch"] = run_batch(client, path, args.texts)
        if args.baseline_seconds > 0 and report["batch"]["texts_per_s"]:
            report["batch_vs_served"] = round(report["batch"]["texts_per_s"] / baseline, 2)
        if args.realtime:
            during = realtime_during(client, path, args)
            report["realtime_during_batch"] = during
            report["p99_ratio"] = round(during["p99_ms"] / report["realtime_alone"]["p99_ms"], 2)
            if args.rounds > 1:
                report["rounds"] = realtime_rounds(
                    client, path, args, first=(report["realtime_alone"], during)
                )
    print(json.dumps(report, indent=2))


def realtime_during(client: BatchClient, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The realtime loop while a fresh batch runs; the batch is cancelled afterwards."""
    during_id = start_batch(client, path)
    wait_started(client, during_id)
    before = client.json("GET", f"/v1/batches/{during_id}")["request_counts"]["completed"]
    started = time.monotonic()
    during = realtime_window(args)
    batch = client.json("GET", f"/v1/batches/{during_id}")
    lines_per_s = (batch["request_counts"]["completed"] - before) / (time.monotonic() - started)
    client.json("POST", f"/v1/batches/{during_id}/cancel")
    wait_done(client, during_id)
    return {
        **during,
        "batch_status_after": batch["status"],
        # What the batch still did beside the realtime client: the price of yielding to it.
        "batch_texts_per_s": round(lines_per_s * args.texts_per_line, 1),
    }


def realtime_rounds(
    client: BatchClient,
    path: Path,
    args: argparse.Namespace,
    first: tuple[dict[str, Any], dict[str, Any]],
) -> dict[str, Any]:
    """Alone and during, alternated: the first pair is the run above, each later pair a fresh
    alone window and a fresh batch."""
    pairs = [first]
    for _ in range(args.rounds - 1):
        pairs.append((realtime_window(args), realtime_during(client, path, args)))
    ratios = [during["p99_ms"] / alone["p99_ms"] for alone, during in pairs]
    return {
        "each": [
            {
                "alone_p50_p99_ms": _pair(alone),
                "during_p50_p99_ms": _pair(during),
                "batch_texts_per_s_during": during["batch_texts_per_s"],
            }
            for alone, during in pairs
        ],
        "p99_ratios": [round(r, 2) for r in ratios],
        "median_alone_p99_ms": round(statistics.median(a["p99_ms"] for a, _ in pairs), 2),
        "median_during_p99_ms": round(statistics.median(d["p99_ms"] for _, d in pairs), 2),
        "median_p99_ratio": round(statistics.median(ratios), 2),
    }


def _pair(latency: dict[str, Any]) -> list[float]:
    return [latency["p50_ms"], latency["p99_ms"]]


def _latency(result: LoadResult) -> dict[str, Any]:
    return {
        "requests": result.requests,
        "failures": result.failures,
        "p50_ms": round(result.p50_ms, 2),
        "p99_ms": round(result.p99_ms, 2),
    }


if __name__ == "__main__":
    main()
