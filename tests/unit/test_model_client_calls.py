"""The ingress's calls to a batched replica (ingress/calls/model_client.py), through a fake
handle: what each `JobCall` carries besides the jobs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from deployments.config import AdmissionConfig
from deployments.config.app import ClassAdmission
from deployments.core.priority import Priority
from deployments.core.protocol import JobCall
from deployments.errors import Overloaded
from deployments.ingress.calls.model_client import ModelClient


@dataclass
class Job:
    job_id: str
    request_id: str

    def __len__(self) -> int:
        return 1


class RecordingHandle:
    """Answers every call with one outcome per job (at once, or when `release` is set),
    and keeps the calls."""

    def __init__(self, release: asyncio.Event | None = None) -> None:
        self.calls: list[JobCall[Job]] = []
        self._release = release

    def remote(self, call: JobCall[Job]) -> asyncio.Task[list[str]]:
        self.calls.append(call)
        return asyncio.ensure_future(self._answer(call))

    async def _answer(self, call: JobCall[Job]) -> list[str]:
        if self._release is not None:
            await self._release.wait()
        return [job.job_id for job in call.jobs]


async def test_each_call_carries_the_target_its_class_is_admitted_by() -> None:
    handle = RecordingHandle()
    normal = ClassAdmission(max_queued_items=64, timeout_s=60, target_ms=400)
    admission = AdmissionConfig(predict_wait=False, normal=normal)
    client: ModelClient[Any, str] = ModelClient("m", handle, admission, max_group_items=8)  # type: ignore[arg-type]
    assert await client.submit(Priority.NORMAL, Job("j1", "r1"), timeout_s=5) == "j1"
    # A model's own target takes the place of the admission's.
    own: ModelClient[Any, str] = ModelClient(
        "m",
        handle,
        admission,
        max_group_items=8,
        model_targets_ms={Priority.NORMAL: 250},  # type: ignore[arg-type]
    )
    assert await own.submit(Priority.NORMAL, Job("j2", "r2"), timeout_s=5) == "j2"
    assert [(c.priority, c.target_s) for c in handle.calls] == [
        (Priority.NORMAL, 0.4),
        (Priority.NORMAL, 0.25),
    ]


async def test_calls_after_a_refusal_say_the_class_is_shedding() -> None:
    release = asyncio.Event()
    handle = RecordingHandle(release)
    normal = ClassAdmission(max_in_flight=1, max_queued_items=1, timeout_s=60)
    client: ModelClient[Any, str] = ModelClient(
        "m",
        handle,  # type: ignore[arg-type]
        AdmissionConfig(predict_wait=False, normal=normal),
        max_group_items=1,
    )
    first = asyncio.create_task(client.submit(Priority.NORMAL, Job("j1", "r1"), timeout_s=5))
    await asyncio.sleep(0.01)  # in flight
    second = asyncio.create_task(client.submit(Priority.NORMAL, Job("j2", "r2"), timeout_s=5))
    await asyncio.sleep(0.01)  # queued: the class's one place is taken
    with pytest.raises(Overloaded):
        await client.submit(Priority.NORMAL, Job("j3", "r3"), timeout_s=5)
    release.set()
    assert await first == "j1" and await second == "j2"
    assert [c.shedding for c in handle.calls] == [False, True]
