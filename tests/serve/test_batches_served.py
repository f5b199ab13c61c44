"""The Batch API on the real app: the official `openai` client's whole cycle (file, batch,
poll, download, cancel) on embeddings, chat and rerank, tenant isolation, and a batch
that outlives the death of the process dispatching it (the SQLite store)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from bench.server import descendants, wait_until_healthy
from tests.serve.conftest import ADMIN_KEY, BATCH_LEASE_S, BULK_KEY, MODEL, RERANK_MODEL, Server

FINAL = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=ADMIN_KEY, max_retries=0)


def jsonl(lines: list[dict[str, Any]]) -> io.BytesIO:
    return io.BytesIO(b"".join(orjson.dumps(line) + b"\n" for line in lines))


def embedding_lines(count: int, tag: str) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"{tag}-{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": f"{tag} sentence number {i} for the batch"},
        }
        for i in range(count)
    ]


def wait_for(client: openai.OpenAI, batch_id: str, timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            batch = client.batches.retrieve(batch_id)
        except (openai.APIConnectionError, openai.InternalServerError):
            batch = None  # the ingress restarting
        if batch is not None and batch.status in FINAL:
            return batch
        time.sleep(0.3)
    raise AssertionError(f"batch {batch_id} did not finish in {timeout_s} s")


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]


def answered(client: openai.OpenAI, batch: Any) -> list[dict[str, Any]]:
    return lines_of(client, batch.output_file_id) + lines_of(client, batch.error_file_id)


def test_the_openai_client_runs_embeddings_chat_and_rerank_batches(
    client: openai.OpenAI,
) -> None:
    broken = b'{"custom_id": "broken"\n'
    data = jsonl(embedding_lines(20, "cycle")).getvalue() + broken
    upload = client.files.create(file=("cycle.jsonl", io.BytesIO(data)), purpose="batch")
    assert client.files.retrieve(upload.id).bytes == len(data)
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata={"suite": "serve"},
    )
    chat_upload = client.files.create(
        file=(
            "chat.jsonl",
            jsonl(
                [
                    {
                        "custom_id": f"chat-{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": {
                            "model": "tiny-llama-demo",
                            "messages": [{"role": "user", "content": f"hello {i}"}],
                            "max_tokens": 4,
                        },
                    }
                    for i in range(2)
                ]
            ),
        ),
        purpose="batch",
    )
    chat = client.batches.create(
        input_file_id=chat_upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    rerank_upload = client.files.create(
        file=(
            "rerank.jsonl",
            jsonl(
                [
                    {
                        "custom_id": "rerank-0",
                        "method": "POST",
                        "url": "/v1/rerank",
                        "body": {
                            "model": RERANK_MODEL,
                            "query": "a cat",
                            "documents": ["a small cat", "a tax form"],
                        },
                    }
                ]
            ),
        ),
        purpose="batch",
    )
    rerank = client.batches.create(
        input_file_id=rerank_upload.id,
        endpoint="/v1/rerank",  # type: ignore[arg-type]  # Tributary's extension
        completion_window="24h",
    )

    done = wait_for(client, batch.id)
    assert done.status == "completed" and done.metadata == {"suite": "serve"}
    assert (done.request_counts.total, done.request_counts.completed) == (21, 20)
    assert done.request_counts.failed == 1
    output = [
        orjson.loads(x) for x in client.files.content(done.output_file_id).content.splitlines()
    ]
    assert [line["custom_id"] for line in output] == [f"cycle-{i}" for i in range(20)]
    body = output[0]["response"]["body"]
    assert output[0]["response"]["status_code"] == 200
    assert len(body["data"][0]["embedding"]) == 384 and body["model"] == MODEL
    (error,) = [
        orjson.loads(x) for x in client.files.content(done.error_file_id).content.splitlines()
    ]
    assert error["error"]["code"] == "invalid_json_line"

    chat_done = wait_for(client, chat.id)
    assert chat_done.request_counts.completed == 2, answered(client, chat_done)
    chat_lines = answered(client, chat_done)
    assert chat_lines[0]["response"]["body"]["object"] == "chat.completion"
    rerank_done = wait_for(client, rerank.id)
    (rerank_line,) = answered(client, rerank_done)
    assert rerank_line["response"]["body"]["results"][0]["index"] == 0

    listed = client.batches.list(limit=2)
    assert [b.id for b in listed.data] == [rerank.id, chat.id] and listed.has_more
    assert client.batches.list(after=chat.id, limit=5).data[0].id == batch.id
    assert client.files.delete(upload.id).deleted


def test_a_cancelled_batch_answers_every_line_once(client: openai.OpenAI) -> None:
    upload = client.files.create(
        file=("cancel.jsonl", jsonl(embedding_lines(300, "cancel"))), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = wait_for(client, batch.id)
    assert done.status == "cancelled"
    ids = sorted(line["custom_id"] for line in answered(client, done))
    assert ids == sorted(f"cancel-{i}" for i in range(300))


def test_another_tenant_gets_404(client: openai.OpenAI, server: Server) -> None:
    upload = client.files.create(
        file=("mine.jsonl", jsonl(embedding_lines(2, "mine"))), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    stranger = openai.OpenAI(base_url=f"{server.url}/v1", api_key=BULK_KEY, max_retries=0)
    for call in (
        lambda: stranger.files.retrieve(upload.id),
        lambda: stranger.files.content(upload.id),
        lambda: stranger.files.delete(upload.id),
        lambda: stranger.batches.retrieve(batch.id),
        lambda: stranger.batches.cancel(batch.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert batch.id not in [b.id for b in stranger.batches.list().data]
    wait_for(client, batch.id)


def test_a_batch_survives_the_death_of_its_dispatcher(
    client: openai.OpenAI, server: Server
) -> None:
    lines = 1000
    upload = client.files.create(
        file=("durable.jsonl", jsonl(embedding_lines(lines, "durable"))), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).request_counts.completed < 40:
        assert time.monotonic() < deadline, "the batch did not start"
        time.sleep(0.05)
    stats = httpx.get(f"{server.url}/v1/stats", timeout=10).json()["batches"]
    assert stats["running"]["id"] == batch.id
    pid = stats["pid"]
    assert pid in descendants(server.process.pid)  # ours to kill
    os.kill(pid, signal.SIGKILL)
    assert stats["running"]["completed"] < lines, "the batch ended before the kill"
    done = wait_for(client, batch.id, timeout_s=120 + BATCH_LEASE_S)
    assert done.status == "completed"
    ids = [line["custom_id"] for line in answered(client, done)]
    assert len(ids) == lines and sorted(ids) == sorted(f"durable-{i}" for i in range(lines))
    assert done.request_counts.completed == lines
    wait_until_healthy(server, 60)


def test_the_cli_submits_follows_and_downloads(server: Server, tmp_path: Path) -> None:
    source = tmp_path / "cli.jsonl"
    source.write_bytes(jsonl(embedding_lines(10, "cli")).getvalue())
    cli = [sys.executable, "-m", "deployments.batch_cli", "--url", server.url]
    ran = subprocess.run(
        [*cli, "submit", str(source), "--endpoint", "/v1/embeddings", "--poll", "0.2"],
        env={**os.environ, "TRIBUTARY_API_KEY": ADMIN_KEY},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "10/10 lines" in ran.stderr and "completed" in ran.stdout
    output = (tmp_path / "cli.output.jsonl").read_bytes().splitlines()
    assert sorted(orjson.loads(x)["custom_id"] for x in output) == sorted(
        f"cli-{i}" for i in range(10)
    )
