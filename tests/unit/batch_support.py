"""Fakes for the Batch API's dispatcher tests: a line runner that answers, refuses, holds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from deployments.config import BatchesConfig
from deployments.core.batch_jobs.records import BatchRecord, FileRecord
from deployments.ingress.batches.dispatcher import LineAnswer
from deployments.ingress.batches.store import BatchStore


class FakeRunner:
    def __init__(self) -> None:
        self.sent: list[str] = []  # request ids, in the order they were sent
        self.refuse = 0  # the next this-many lines get a 429
        self.gate = asyncio.Event()
        self.gate.set()
        self.busy: str = "idle"  # what others() says
        self.in_flight = 0
        self.most_in_flight = 0

    async def run(self, endpoint: str, body: bytes, tenant: str, request_id: str) -> LineAnswer:
        self.sent.append(request_id)
        if self.refuse:
            self.refuse -= 1
            return LineAnswer(429, b'{"error": {"code": "load_shed"}}', 0.05)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
        finally:
            self.in_flight -= 1
        text = orjson.loads(body)["input"]
        return LineAnswer(200, orjson.dumps({"echo": text}))

    def admitted_lines(self) -> int:
        return 10**6

    def others(self, endpoint: str) -> Any:
        return self.busy


def config(**changes: object) -> BatchesConfig:
    return BatchesConfig.model_validate({"poll_s": 0.01, "lease_s": 0.3, **changes})


def input_file(count: int, extra: bytes = b"") -> bytes:
    return (
        b"".join(
            orjson.dumps(
                {
                    "custom_id": f"c{i}",
                    "method": "POST",
                    "url": "/v1/embeddings",
                    "body": {"input": f"t{i}"},
                }
            )
            + b"\n"
            for i in range(count)
        )
        + extra
    )


async def new_batch(
    store: BatchStore, data: bytes, lines: int, batch_id: str = "batch_1", window_s: int = 3600
) -> BatchRecord:
    file_id = f"file-{batch_id}"
    store.files.path(file_id).write_bytes(data)
    await store.put_file(FileRecord(file_id, "t", "in.jsonl", "batch", len(data), 0, lines))
    now = int(time.time())
    record = BatchRecord(
        id=batch_id,
        tenant="t",
        endpoint="/v1/embeddings",
        input_file_id=file_id,
        completion_window="24h",
        created_at=now,
        expires_at=now + window_s,
        total=lines,
    )
    await store.create_batch(record)
    return record


class DyingStore:
    """The store as a dispatcher sees it, until its process dies: then every call fails,
    so nothing after the death (a release, a finalize) reaches the store."""

    def __init__(self, store: BatchStore) -> None:
        self._store = store
        self.dead = False

    def __getattr__(self, name: str) -> object:
        value = getattr(self._store, name)
        if not callable(value):
            return value

        def call(*args: object, **kwargs: object) -> object:
            if self.dead:
                raise RuntimeError("the process is gone")
            return value(*args, **kwargs)

        return call


def output_ids(store: BatchStore, file_id: str | None) -> list[str | None]:
    if file_id is None:
        return []
    path: Path = store.files.path(file_id)
    return [orjson.loads(line)["custom_id"] for line in path.read_bytes().splitlines()]
