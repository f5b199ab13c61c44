"""A batch across a restart of the whole app: starts the default app, submits an N-text
embedding batch, stops the app (Ctrl-C, as an operator would) once a share of the lines is
answered, starts it again on the same batch store, and checks the output: every custom_id
exactly once, none lost (issue 29's measure).

    python -m bench.batch_restart --texts 100000 --stop-at 0.3

Starts its own servers (bench/server.py): run it with no `make serve` beside it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bench.batch_jobs import batch_file, start_batch, wait_done
from bench.server import load_config, running_server
from bench.texts import sentences
from deployments.batch_cli import BatchClient


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_restart")
    parser.add_argument("--texts", type=int, default=100_000)
    parser.add_argument("--stop-at", type=float, default=0.3, help="share answered, then stop")
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"texts": args.texts}
    with tempfile.TemporaryDirectory() as workdir:
        root = Path(workdir)
        config = load_config()
        config["applications"][0]["args"]["batches"] = {"path": str(root / "store")}
        path = root / "batch.jsonl"
        batch_file(path, sentences(args.texts, seed=29), 1, args.model)
        (root / "first").mkdir()
        (root / "second").mkdir()
        with running_server(config, root / "first") as server:
            client = BatchClient(server.url, None)
            batch_id = start_batch(client, path)
            started = time.monotonic()
            while True:
                batch = client.json("GET", f"/v1/batches/{batch_id}")
                counts = batch["request_counts"]
                if counts["completed"] + counts["failed"] >= args.stop_at * args.texts:
                    break
                time.sleep(0.2)
            report["answered_before_stop"] = counts["completed"] + counts["failed"]
            report["seconds_before_stop"] = round(time.monotonic() - started, 1)
        stopped = time.monotonic()
        with running_server(config, root / "second") as server:
            client = BatchClient(server.url, None)
            report["restart_s"] = round(time.monotonic() - stopped, 1)
            batch = wait_done(client, batch_id)
            report["status"] = batch["status"]
            report["request_counts"] = batch["request_counts"]
            ids: Counter[str] = Counter()
            for file_id in (batch["output_file_id"], batch["error_file_id"]):
                if file_id is not None:
                    content = client.call("GET", f"/v1/files/{file_id}/content")
                    ids.update(orjson.loads(line)["custom_id"] for line in content.splitlines())
    expected = {f"t{i}" for i in range(args.texts)}
    report["output_lines"] = sum(ids.values())
    report["custom_ids_twice"] = sum(1 for n in ids.values() if n > 1)
    report["custom_ids_missing"] = len(expected - set(ids))
    report["exactly_once"] = set(ids) == expected and report["custom_ids_twice"] == 0
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
