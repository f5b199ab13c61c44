"""The fake downstream model, the test-driven loop clock and the helpers the coalescer
tests share."""

import asyncio

import pytest

from deployments.core.admission.coalescer import Coalescer


class FakeModel:
    """Records every call; `gate` holds calls open until the test releases them."""

    def __init__(self) -> None:
        self.calls: list[list[list[str]]] = []
        self.time_left: list[list[float | None]] = []
        self.spent: list[list[float]] = []
        self.cancelled: list[list[list[str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_with: BaseException | None = None
        self.fail_on: str | None = None  # fail any call with a job holding this text

    async def send(
        self, jobs: list[list[str]], time_left: list[float | None], spent: list[float]
    ) -> list[str]:
        self.calls.append(jobs)
        self.time_left.append(time_left)
        self.spent.append(spent)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled.append(jobs)
            raise
        if self.fail_with is not None:
            raise self.fail_with
        if self.fail_on is not None and any(self.fail_on in job for job in jobs):
            raise RuntimeError(f"cannot do {self.fail_on}")
        return ["+".join(job) for job in jobs]

    @property
    def sent(self) -> list[list[str]]:
        return [job for call in self.calls for job in call]


class LoopClock:
    """The running loop's clock, moved only by the test: deadlines pass when it says."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        self.now = loop.time()
        monkeypatch.setattr(loop, "time", lambda: self.now)

    async def advance(self, seconds: float) -> None:
        self.now += seconds
        await settle()


def make(model: FakeModel, **overrides: object) -> Coalescer[list[str], str]:
    options: dict[str, object] = {"max_in_flight": 1, "max_group_items": 100}
    options.update(overrides)
    return Coalescer(model.send, size_of=len, **options)  # type: ignore[arg-type]


async def settle() -> None:
    """Let every runnable task and callback run up to its next wait."""
    for _ in range(5):
        await asyncio.sleep(0)


def assert_drained(coalescer: Coalescer[list[str], str]) -> None:
    stats = coalescer.stats
    assert (stats.queued_jobs, stats.queued_items, stats.in_flight) == (0, 0, 0)
    assert coalescer.queued_items == 0
    # no call task left behind, and no task of the test still waiting on a future
    assert asyncio.all_tasks() == {asyncio.current_task()}


async def start_busy_call(coalescer: Coalescer[list[str], str], model: FakeModel) -> asyncio.Task:
    """Hold the only call slot open with a job of its own."""
    model.gate.clear()
    busy = asyncio.create_task(coalescer.submit(["x"]))
    await settle()
    assert coalescer.stats.in_flight == 1
    return busy
