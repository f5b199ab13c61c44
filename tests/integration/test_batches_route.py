"""The Batch API over the ingress's HTTP app (fake model): the official `openai` client's
whole cycle, tenants, limits and malformed lines, with the SQLite store in a temp dir."""

from __future__ import annotations

import asyncio
import copy
import io
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import orjson
import pytest

from deployments.core.access.keys import digest
from tests.integration.conftest import CONFIG, Harness

MODEL = "fake-embedder"
KEY_A = "trib-tenant-a-key"
KEY_B = "trib-tenant-b-key"


def batch_config(root: Path, **limits: object) -> dict:
    config = copy.deepcopy(CONFIG)
    config["auth"] = {
        "tenants": [
            {"name": "a", "key_sha256": [digest(KEY_A)]},
            {"name": "b", "key_sha256": [digest(KEY_B)]},
        ]
    }
    config["batches"] = {"path": str(root), "poll_s": 0.02, "lease_s": 3, **limits}
    return config


def embedding_lines(count: int, model: str = MODEL) -> bytes:
    return b"".join(
        orjson.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": model, "input": f"text number {i}"},
            }
        )
        + b"\n"
        for i in range(count)
    )


class Served:
    def __init__(self, root: Path, **limits: object) -> None:
        self.harness = Harness(batch_config(root, **limits))
        self.transport = httpx.ASGITransport(app=self.harness.app, raise_app_exceptions=False)

    def client(self, key: str) -> openai.AsyncOpenAI:
        http = httpx.AsyncClient(transport=self.transport, base_url="http://ingress/v1")
        return openai.AsyncOpenAI(
            base_url="http://ingress/v1", api_key=key, http_client=http, max_retries=0
        )

    async def close(self) -> None:
        await self.harness.app.app.state.batches.stop()


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    served = Served(tmp_path)
    yield served
    await served.close()


async def wait_done(client: openai.AsyncOpenAI, batch_id: str, timeout_s: float = 10) -> object:
    for _ in range(int(timeout_s / 0.02)):
        batch = await client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        await asyncio.sleep(0.02)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


async def test_the_openai_client_runs_the_whole_cycle(served: Served) -> None:
    client = served.client(KEY_A)
    bad = b'{"custom_id": "broken", "url": "/v1/embeddings"\n'
    wrong_model = embedding_lines(1, model="no-such-model").replace(b"req-0", b"req-x")
    data = embedding_lines(5) + bad + wrong_model
    uploaded = await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    assert uploaded.bytes == len(data) and uploaded.purpose == "batch"
    assert (await client.files.retrieve(uploaded.id)).filename == "in.jsonl"
    batch = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata={"job": "test"},
    )
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    done = await wait_done(client, batch.id)
    assert done.status == "completed"
    assert done.request_counts.total == 7
    assert (done.request_counts.completed, done.request_counts.failed) == (5, 2)
    assert done.completed_at is not None and done.in_progress_at is not None
    output = (await client.files.content(done.output_file_id)).content
    lines = [orjson.loads(line) for line in output.splitlines()]
    assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(5)]
    first = lines[0]
    assert first["response"]["status_code"] == 200 and first["error"] is None
    assert first["response"]["body"]["data"][0]["object"] == "embedding"
    errors = [
        orjson.loads(x)
        for x in (await client.files.content(done.error_file_id)).content.splitlines()
    ]
    by_id = {e["custom_id"]: e for e in errors}
    assert by_id[None]["error"]["code"] == "invalid_json_line"
    assert by_id["req-x"]["response"]["status_code"] == 404
    # Every line of the batch went through the model as a batch-class request.
    assert set(served.harness.embedder.priorities) == {"batch"}
    listed = await client.batches.list(limit=10)
    assert [b.id for b in listed.data] == [batch.id]
    deleted = await client.files.delete(uploaded.id)
    assert deleted.deleted


async def test_another_tenant_gets_404(served: Served) -> None:
    owner, stranger = served.client(KEY_A), served.client(KEY_B)
    uploaded = await owner.files.create(
        file=("in.jsonl", io.BytesIO(embedding_lines(2))), purpose="batch"
    )
    batch = await owner.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    for call in (
        stranger.files.retrieve(uploaded.id),
        stranger.files.content(uploaded.id),
        stranger.files.delete(uploaded.id),
        stranger.batches.retrieve(batch.id),
        stranger.batches.cancel(batch.id),
        stranger.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            await call
    assert (await stranger.batches.list()).data == []


async def test_cancel_stops_a_batch_and_keeps_finished_lines(served: Served) -> None:
    client = served.client(KEY_A)
    served.harness.embedder.gate.clear()  # hold the model: lines stay in flight
    uploaded = await client.files.create(
        file=("in.jsonl", io.BytesIO(embedding_lines(200))), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    for _ in range(200):
        if served.harness.embedder.calls:
            break
        await asyncio.sleep(0.01)
    cancelling = await client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    served.harness.embedder.gate.set()
    done = await wait_done(client, batch.id)
    assert done.status == "cancelled"
    answered = []
    for file_id in (done.output_file_id, done.error_file_id):
        if file_id is not None:
            content = (await client.files.content(file_id)).content
            answered += [orjson.loads(line)["custom_id"] for line in content.splitlines()]
    assert sorted(answered) == sorted(f"req-{i}" for i in range(200))
    with pytest.raises(openai.ConflictError):
        await client.batches.cancel(batch.id)


async def test_limits_answer_clear_errors(tmp_path: Path) -> None:
    served = Served(
        tmp_path, max_file_bytes=2048, max_line_bytes=300, max_lines_per_batch=3, max_open_batches=1
    )
    client = served.client(KEY_A)
    try:
        with pytest.raises(openai.APIStatusError) as big:
            await client.files.create(
                file=("in.jsonl", io.BytesIO(embedding_lines(40))), purpose="batch"
            )
        assert big.value.status_code == 413 and big.value.body["code"] == "file_too_large"
        long_line = embedding_lines(1).replace(b"text number 0", b"x" * 400)
        with pytest.raises(openai.APIStatusError) as line:
            await client.files.create(file=("in.jsonl", io.BytesIO(long_line)), purpose="batch")
        assert line.value.status_code == 413 and line.value.body["code"] == "line_too_large"
        many = await client.files.create(
            file=("in.jsonl", io.BytesIO(embedding_lines(4))), purpose="batch"
        )
        with pytest.raises(openai.BadRequestError) as lines:
            await client.batches.create(
                input_file_id=many.id, endpoint="/v1/embeddings", completion_window="24h"
            )
        assert lines.value.body["code"] == "too_many_lines"
        with pytest.raises(openai.BadRequestError) as window:
            await client.batches.create(
                input_file_id=many.id, endpoint="/v1/embeddings", completion_window="1h"
            )
        assert window.value.body["param"] == "completion_window"
        served.harness.embedder.gate.clear()
        few = await client.files.create(
            file=("in.jsonl", io.BytesIO(embedding_lines(2))), purpose="batch"
        )
        await client.batches.create(
            input_file_id=few.id, endpoint="/v1/embeddings", completion_window="24h"
        )
        with pytest.raises(openai.RateLimitError) as open_batches:
            await client.batches.create(
                input_file_id=few.id, endpoint="/v1/embeddings", completion_window="24h"
            )
        assert open_batches.value.body["code"] == "too_many_open_batches"
        served.harness.embedder.gate.set()
    finally:
        await served.close()


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("POST", "/v1/files", {"content": b"not multipart"}, 400),
        ("POST", "/v1/files", {"files": {"file": ("a.jsonl", b"{}")}}, 400),  # no purpose
        ("POST", "/v1/files", {"data": {"purpose": "batch"}, "files": {"x": ("a", b"")}}, 400),
        (
            "POST",
            "/v1/files",
            {"data": {"purpose": "fine-tune"}, "files": {"file": ("a.jsonl", b"{}")}},
            400,
        ),
        (
            "POST",
            "/v1/files",
            {
                "content": b'--b\r\nContent-Disposition: form-data; name="file"\r\n\r\nunfinished',
                "headers": {"Content-Type": "multipart/form-data; boundary=b"},
            },
            400,
        ),
        ("POST", "/v1/batches", {"content": b"[]"}, 400),
        ("POST", "/v1/batches", {"json": {"input_file_id": "file-x"}}, 400),
        (
            "POST",
            "/v1/batches",
            {
                "json": {
                    "input_file_id": "file-x",
                    "endpoint": "/v1/moderations",
                    "completion_window": "24h",
                }
            },
            400,
        ),
        (
            "POST",
            "/v1/batches",
            {
                "json": {
                    "input_file_id": "file-nope",
                    "endpoint": "/v1/embeddings",
                    "completion_window": "24h",
                }
            },
            404,
        ),
        ("GET", "/v1/batches?limit=0", {}, 400),
        ("GET", "/v1/batches?limit=abc", {}, 400),
        ("GET", "/v1/batches?after=batch_nope", {}, 200),
        ("GET", "/v1/files/..%2F..%2Fetc%2Fpasswd/content", {}, 404),
        ("GET", "/v1/batches/" + "x" * 5000, {}, 404),
        ("POST", "/v1/batches/batch_nope/cancel", {}, 404),
    ],
)
async def test_bad_requests_answer_4xx_in_the_error_shape(
    served: Served, method: str, path: str, kwargs: dict, status: int
) -> None:
    async with httpx.AsyncClient(transport=served.transport, base_url="http://ingress") as http:
        headers = {"Authorization": f"Bearer {KEY_A}", **kwargs.pop("headers", {})}
        response = await http.request(method, path, headers=headers, **kwargs)
    assert response.status_code == status, response.text
    if status >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


async def test_without_a_key_the_batch_routes_answer_401(served: Served) -> None:
    async with httpx.AsyncClient(transport=served.transport, base_url="http://ingress") as http:
        for method, path in (("GET", "/v1/batches"), ("POST", "/v1/files"), ("GET", "/v1/files/x")):
            assert (await http.request(method, path)).status_code == 401
