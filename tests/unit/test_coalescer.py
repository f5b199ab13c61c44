import asyncio

import pytest

from deployments.core.coalescer import Coalescer, CoalescerStats, DeadlineExpired


class FakeModel:
    """Records every call; `gate` holds calls open until the test releases them."""

    def __init__(self) -> None:
        self.calls: list[list[list[str]]] = []
        self.time_left: list[list[float | None]] = []
        self.cancelled: list[list[list[str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_with: Exception | None = None
        self.fail_on: str | None = None  # fail any call with a job holding this text

    async def send(self, jobs: list[list[str]], time_left: list[float | None]) -> list[str]:
        self.calls.append(jobs)
        self.time_left.append(time_left)
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


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        make(FakeModel(), max_in_flight=0)
    with pytest.raises(ValueError):
        make(FakeModel(), max_group_items=0)


async def test_a_lone_request_goes_out_at_once_in_its_own_call() -> None:
    model = FakeModel()
    coalescer = make(model)
    assert await coalescer.submit(["a", "b"]) == "a+b"
    assert model.calls == [[["a", "b"]]]
    assert model.time_left == [[None]]
    assert_drained(coalescer)


async def test_requests_arriving_while_the_call_is_busy_leave_together() -> None:
    model = FakeModel()
    coalescer = make(model)
    first = await start_busy_call(coalescer, model)
    waiting = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(2, 6)]
    await settle()
    assert len(model.calls) == 1  # the others wait for the busy call
    assert (coalescer.stats.queued_jobs, coalescer.stats.queued_items) == (4, 4)
    model.gate.set()
    results = await asyncio.gather(first, *waiting)
    assert results == ["x", "2", "3", "4", "5"]
    assert model.calls == [[["x"]], [["2"], ["3"], ["4"], ["5"]]]
    stats = coalescer.stats
    assert (stats.calls, stats.jobs, stats.items, stats.largest_call_jobs) == (2, 5, 5, 4)
    assert_drained(coalescer)


async def test_requests_arriving_in_the_same_loop_turn_leave_in_one_call() -> None:
    model = FakeModel()
    coalescer = make(model)
    tasks = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    assert await asyncio.gather(*tasks) == ["0", "1", "2"]
    assert model.calls == [[["0"], ["1"], ["2"]]]


async def test_a_group_never_exceeds_max_group_items_but_a_big_job_still_goes() -> None:
    model = FakeModel()
    coalescer = make(model, max_group_items=3)
    blocker = await start_busy_call(coalescer, model)
    jobs = [["a", "b"], ["c", "d"], ["e", "f", "g", "h"], ["i"]]
    tasks = [asyncio.create_task(coalescer.submit(job)) for job in jobs]
    await settle()
    assert coalescer.stats.queued_items == 9
    model.gate.set()
    await asyncio.gather(blocker, *tasks)
    assert [sum(len(job) for job in call) for call in model.calls] == [1, 2, 2, 4, 1]
    assert_drained(coalescer)


async def test_calls_in_flight_never_exceed_the_limit() -> None:
    model = FakeModel()
    coalescer = make(model, max_in_flight=2)
    model.gate.clear()
    tasks = []
    for i in range(10):
        tasks.append(asyncio.create_task(coalescer.submit([str(i)])))
        await settle()
    assert coalescer.stats.in_flight == 2
    assert coalescer.stats.queued_jobs == 8
    model.gate.set()
    assert await asyncio.gather(*tasks) == [str(i) for i in range(10)]
    # Two lone calls filled the slots; the eight that waited left in one call.
    assert [len(call) for call in model.calls] == [1, 1, 8]
    assert_drained(coalescer)


# --- failures ---------------------------------------------------------------------------


async def test_a_failed_call_fails_every_request_in_it_and_nothing_hangs() -> None:
    model = FakeModel()
    coalescer = make(model, max_in_flight=1)
    model.gate.clear()
    model.fail_with = RuntimeError("model exploded")
    tasks = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(4)]
    await settle()
    model.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) and str(r) == "model exploded" for r in results)
    assert_drained(coalescer)


async def test_a_failed_call_does_not_stop_the_queue_behind_it() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.fail_on = "x"
    busy = await start_busy_call(coalescer, model)
    behind = asyncio.create_task(coalescer.submit(["later"]))
    await settle()
    model.gate.set()
    with pytest.raises(RuntimeError, match="cannot do x"):
        await busy
    assert await behind == "later"
    assert await coalescer.submit(["fresh"]) == "fresh"
    assert_drained(coalescer)


async def test_a_wrong_number_of_outcomes_is_an_error_for_every_request() -> None:
    async def short(jobs: list[list[str]], time_left: list[float | None]) -> list[str]:
        return ["only one"]

    coalescer: Coalescer[list[str], str] = Coalescer(
        short, size_of=len, max_in_flight=1, max_group_items=10
    )
    tasks = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    assert_drained(coalescer)


async def test_the_downstreams_own_timeout_is_not_mistaken_for_the_deadline() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.fail_with = TimeoutError("downstream timed out")
    deadline = asyncio.get_running_loop().time() + 60
    with pytest.raises(TimeoutError, match="downstream timed out"):
        await coalescer.submit(["a"], deadline)
    assert coalescer.stats.expired == 0
    assert_drained(coalescer)


async def test_a_failure_reaches_the_jobs_left_in_a_call_after_one_has_gone() -> None:
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, on_abandon=abandoned.append)
    model.gate.clear()
    model.fail_with = RuntimeError("model exploded")
    leaving = asyncio.create_task(coalescer.submit(["gone"]))
    staying = asyncio.create_task(coalescer.submit(["kept"]))
    await settle()
    leaving.cancel()
    await settle()
    model.gate.set()
    with pytest.raises(RuntimeError):
        await staying
    assert leaving.cancelled()
    assert abandoned == [["gone"]]
    assert_drained(coalescer)


# --- deadlines ----------------------------------------------------------------------------


async def test_send_is_told_the_time_left_for_each_job(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    busy = await start_busy_call(coalescer, model)
    tasks = [
        asyncio.create_task(coalescer.submit(["a"], clock.now + 5)),
        asyncio.create_task(coalescer.submit(["b"])),
        asyncio.create_task(coalescer.submit(["c"], clock.now + 2)),
    ]
    await settle()
    await clock.advance(1.5)  # time spent queued counts against the deadline
    model.gate.set()
    assert await asyncio.gather(busy, *tasks) == ["x", "a", "b", "c"]
    assert model.time_left == [[None], [3.5, None, 0.5]]


async def test_a_job_whose_deadline_passes_while_queued_is_never_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    busy = await start_busy_call(coalescer, model)
    expiring = asyncio.create_task(coalescer.submit(["late", "r"], clock.now + 1))
    patient = asyncio.create_task(coalescer.submit(["kept"], clock.now + 10))
    await settle()
    assert coalescer.stats.queued_items == 3
    await clock.advance(1)
    with pytest.raises(DeadlineExpired):
        await expiring  # answered at its deadline, while the busy call is still open
    assert not busy.done()
    assert (coalescer.stats.queued_jobs, coalescer.stats.queued_items) == (1, 1)
    model.gate.set()
    assert await asyncio.gather(busy, patient) == ["x", "kept"]
    assert ["late", "r"] not in model.sent
    assert model.calls == [[["x"]], [["kept"]]]
    assert coalescer.stats.expired == 1
    assert_drained(coalescer)


async def test_a_job_already_past_its_deadline_is_never_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    with pytest.raises(DeadlineExpired):
        await coalescer.submit(["late"], clock.now - 1)
    assert model.calls == []
    assert coalescer.stats.expired == 1
    assert_drained(coalescer)
    assert await coalescer.submit(["next"]) == "next"


async def test_an_expired_job_at_the_head_of_the_queue_does_not_hold_up_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    expired = asyncio.create_task(coalescer.submit(["late"], clock.now))
    fresh = asyncio.create_task(coalescer.submit(["fresh"], clock.now + 1))
    assert await fresh == "fresh"
    with pytest.raises(DeadlineExpired):
        await expired
    assert model.calls == [[["fresh"]]]
    assert coalescer.stats.expired == 1
    assert_drained(coalescer)


async def test_an_expired_head_whose_client_also_left_does_not_strand_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    leaving = asyncio.create_task(coalescer.submit(["late"], clock.now))
    staying = asyncio.create_task(coalescer.submit(["kept"]))
    await asyncio.sleep(0)  # both queued; the dispatch is due next
    leaving.cancel()  # the client goes in the same loop turn the dispatcher meets it
    await settle()
    assert staying.done(), "the job behind the leaver was never sent"
    assert staying.result() == "kept"
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert model.sent == [["kept"]]
    assert_drained(coalescer)


async def test_a_job_whose_deadline_passes_after_it_was_sent_expires_on_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    coalescer = make(model)
    model.gate.clear()
    job = asyncio.create_task(coalescer.submit(["slow"], clock.now + 1))
    await settle()
    assert model.sent == [["slow"]]
    await clock.advance(1)
    with pytest.raises(DeadlineExpired):
        await job  # at the deadline, without waiting for the call
    # It was the call's only job, so the call itself was cancelled.
    assert model.cancelled == [[["slow"]]]
    stats = coalescer.stats
    assert (stats.expired, stats.abandoned, stats.cancelled_calls) == (1, 1, 1)
    assert_drained(coalescer)


async def test_an_outcome_arriving_after_the_deadline_is_discarded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, on_abandon=abandoned.append)
    model.gate.clear()
    late = asyncio.create_task(coalescer.submit(["late"], clock.now + 1))
    other = asyncio.create_task(coalescer.submit(["other"]))
    await settle()
    assert model.calls == [[["late"], ["other"]]]
    await clock.advance(1)
    with pytest.raises(DeadlineExpired):
        await late
    assert abandoned == [["late"]]  # the caller may tell the model to skip it
    assert model.cancelled == []  # the call still serves another job
    model.gate.set()
    assert await other == "other"
    assert late.exception().__class__ is DeadlineExpired  # not overwritten by the outcome
    stats = coalescer.stats
    assert (stats.expired, stats.abandoned, stats.cancelled_calls) == (1, 1, 0)
    assert_drained(coalescer)


async def test_an_answer_arriving_as_the_deadline_fires_is_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    deadline = clock.now + 1

    async def answers_at_the_deadline(
        jobs: list[list[str]], time_left: list[float | None]
    ) -> list[str]:
        clock.now = deadline  # the deadline's timer is due in the next loop turn ...
        await asyncio.sleep(0)
        return ["done"]  # ... and runs right after this answer, in that same turn

    coalescer: Coalescer[list[str], str] = Coalescer(
        answers_at_the_deadline, size_of=len, max_in_flight=1, max_group_items=10
    )
    outcome = await asyncio.gather(coalescer.submit(["a"], deadline), return_exceptions=True)
    assert outcome == ["done"]
    assert_drained(coalescer)


# --- cancellation ---------------------------------------------------------------------------


async def test_a_request_cancelled_while_waiting_is_never_sent() -> None:
    model = FakeModel()
    coalescer = make(model)
    busy = await start_busy_call(coalescer, model)
    leaving = asyncio.create_task(coalescer.submit(["gone", "too"]))
    staying = asyncio.create_task(coalescer.submit(["kept"]))
    await settle()
    assert (coalescer.stats.queued_jobs, coalescer.stats.queued_items) == (2, 3)
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert (coalescer.stats.queued_jobs, coalescer.stats.queued_items) == (1, 1)
    model.gate.set()
    assert await asyncio.gather(busy, staying) == ["x", "kept"]
    assert ["gone", "too"] not in model.sent
    assert coalescer.stats.abandoned == 0  # it never reached the model
    assert_drained(coalescer)


async def test_when_every_job_of_a_sent_call_is_gone_the_call_is_cancelled() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.gate.clear()
    jobs = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    await settle()
    assert coalescer.stats.in_flight == 1
    queued = asyncio.create_task(coalescer.submit(["next"]))
    await settle()
    for job in jobs:
        job.cancel()
    await settle()
    assert model.cancelled == [[["0"], ["1"], ["2"]]]
    assert coalescer.stats.cancelled_calls == 1
    assert coalescer.stats.abandoned == 3
    # The freed slot goes to the job queued behind the cancelled call.
    assert model.calls[-1] == [["next"]]
    model.gate.set()
    assert await queued == "next"
    assert all(job.cancelled() for job in jobs)
    assert_drained(coalescer)


async def test_when_some_jobs_of_a_sent_call_are_gone_on_abandon_is_told() -> None:
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, on_abandon=abandoned.append)
    model.gate.clear()
    jobs = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(3)]
    await settle()
    jobs[1].cancel()
    await settle()
    assert abandoned == [["1"]]
    assert model.cancelled == []
    assert coalescer.stats.in_flight == 1
    model.gate.set()
    assert await jobs[0] == "0"
    assert await jobs[2] == "2"
    assert jobs[1].cancelled()
    stats = coalescer.stats
    assert (stats.abandoned, stats.cancelled_calls) == (1, 0)
    assert_drained(coalescer)


async def test_partial_abandonment_without_on_abandon_is_fine() -> None:
    model = FakeModel()
    coalescer = make(model)
    model.gate.clear()
    jobs = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(2)]
    await settle()
    jobs[0].cancel()
    await settle()
    model.gate.set()
    assert await jobs[1] == "1"
    assert_drained(coalescer)


async def test_the_last_job_leaving_cancels_the_call_even_after_others_left_earlier() -> None:
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, on_abandon=abandoned.append)
    model.gate.clear()
    jobs = [asyncio.create_task(coalescer.submit([str(i)])) for i in range(2)]
    await settle()
    jobs[0].cancel()
    await settle()
    assert model.cancelled == []
    jobs[1].cancel()
    await settle()
    assert abandoned == [["0"]]  # the last one cancels the call instead
    assert model.cancelled == [[["0"], ["1"]]]
    assert_drained(coalescer)


async def test_expiry_and_cancellation_together_free_everything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = LoopClock(monkeypatch)
    model = FakeModel()
    abandoned: list[list[str]] = []
    coalescer = make(model, max_in_flight=2, max_group_items=2, on_abandon=abandoned.append)
    model.gate.clear()
    tasks = [
        asyncio.create_task(coalescer.submit([str(i)], clock.now + 1 + i % 3)) for i in range(12)
    ]
    await settle()
    assert coalescer.stats.in_flight == 2
    tasks[0].cancel()
    tasks[5].cancel()
    tasks[11].cancel()
    await clock.advance(1)
    await clock.advance(1)
    model.gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert_drained(coalescer)
    stats: CoalescerStats = coalescer.stats
    answered = [r for r in results if isinstance(r, str)]
    expired = [r for r in results if isinstance(r, DeadlineExpired)]
    cancelled = [r for r in results if isinstance(r, asyncio.CancelledError)]
    assert len(answered) + len(expired) + len(cancelled) == 12
    assert len(cancelled) == 3
    assert stats.expired == len(expired) > 0
    assert set(answered) <= {job[0] for job in model.sent}
