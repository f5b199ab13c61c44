"""`python -m deployments.batch_cli submit FILE --endpoint /v1/embeddings`: uploads a JSONL
file of requests, creates a batch, shows its progress until it ends, and downloads the
output (and error) file. Also `status BATCH_ID` and `cancel BATCH_ID`.

Only the standard library: it runs wherever Python does, beside the server or far from it.
The API key comes from --key or the environment variable TRIBUTARY_API_KEY.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, TextIO

FINAL = ("completed", "failed", "expired", "cancelled")
BAR_WIDTH = 30


class ApiError(Exception):
    pass


class BatchClient:
    def __init__(self, url: str, key: str | None, timeout_s: float = 300) -> None:
        self.base = url.rstrip("/")
        self.key = key
        self.timeout_s = timeout_s

    def call(
        self, method: str, path: str, body: bytes | None = None, content_type: str | None = None
    ) -> bytes:
        request = urllib.request.Request(self.base + path, data=body, method=method)
        if self.key:
            request.add_header("Authorization", f"Bearer {self.key}")
        if content_type:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return bytes(response.read())
        except urllib.error.HTTPError as exc:
            raise ApiError(f"{method} {path}: {exc.code} {_message(exc.read())}") from None
        except urllib.error.URLError as exc:
            raise ApiError(f"{method} {path}: cannot reach {self.base}: {exc.reason}") from None

    def json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        content_type = None if body is None else "application/json"
        return json.loads(self.call(method, path, data, content_type))

    def upload(self, path: Path) -> dict[str, Any]:
        boundary = secrets.token_hex(16)
        head = (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            f'filename="{path.name}"\r\nContent-Type: application/jsonl\r\n\r\n'
        ).encode()
        body = head + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
        data = self.call("POST", "/v1/files", body, f"multipart/form-data; boundary={boundary}")
        return dict(json.loads(data))


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode(errors="replace")


def progress_line(batch: dict[str, Any], started: float, now: float) -> str:
    counts = batch["request_counts"]
    total, done = counts["total"], counts["completed"] + counts["failed"]
    filled = BAR_WIDTH * done // total if total else 0
    rate = done / (now - started) if now > started else 0.0
    return (
        f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} lines "
        f"({counts['failed']} failed)  {batch['status']}  {rate:.0f} lines/s"
    )


def follow(client: BatchClient, batch_id: str, poll_s: float, out: TextIO) -> dict[str, Any]:
    started = time.monotonic()
    while True:
        batch: dict[str, Any] = client.json("GET", f"/v1/batches/{batch_id}")
        out.write("\r" + progress_line(batch, started, time.monotonic()))
        out.flush()
        if batch["status"] in FINAL:
            out.write("\n")
            return batch
        time.sleep(poll_s)


def submit(client: BatchClient, args: argparse.Namespace) -> int:
    source = Path(args.file)
    uploaded = client.upload(source)
    metadata = dict(pair.split("=", 1) for pair in args.metadata) if args.metadata else None
    batch = client.json(
        "POST",
        "/v1/batches",
        {
            "input_file_id": uploaded["id"],
            "endpoint": args.endpoint,
            "completion_window": "24h",
            "metadata": metadata,
        },
    )
    print(f"batch {batch['id']} (file {uploaded['id']}, {uploaded['bytes']} bytes)")
    try:
        batch = follow(client, batch["id"], args.poll, sys.stderr)
    except KeyboardInterrupt:
        print(f"\nstill running on the server: {batch['id']} (cancel: ... cancel {batch['id']})")
        return 130
    output = Path(args.output or source.with_suffix(".output.jsonl"))
    for file_id, path in (
        (batch["output_file_id"], output),
        (batch["error_file_id"], output.with_name(output.stem + ".errors.jsonl")),
    ):
        if file_id is not None:
            path.write_bytes(client.call("GET", f"/v1/files/{file_id}/content"))
            print(f"wrote {path}")
    print(f"{batch['status']}: {json.dumps(batch['request_counts'])}")
    return 0 if batch["status"] == "completed" else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deployments.batch_cli")
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server")
    parser.add_argument("--key", help="API key (default: $TRIBUTARY_API_KEY)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("submit", help="upload FILE, run it as a batch, download")
    run.add_argument("file", help="JSONL: one {custom_id, method, url, body} a line")
    run.add_argument("--endpoint", default="/v1/embeddings")
    run.add_argument("--output", help="where the output goes (default: FILE.output.jsonl)")
    run.add_argument("--metadata", nargs="*", help="key=value pairs kept with the batch")
    run.add_argument("--poll", type=float, default=1.0, help="seconds between checks")
    for name in ("status", "cancel"):
        commands.add_parser(name, help=f"{name} a batch").add_argument("batch_id")
    args = parser.parse_args(argv)
    client = BatchClient(args.url, args.key or os.environ.get("TRIBUTARY_API_KEY"))
    try:
        if args.command == "submit":
            return submit(client, args)
        method, suffix = ("POST", "/cancel") if args.command == "cancel" else ("GET", "")
        print(json.dumps(client.json(method, f"/v1/batches/{args.batch_id}{suffix}"), indent=2))
        return 0
    except ApiError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
