"""Admission by predicted wait through ClassQueues, with a fake clock and a service rate
measured from fake calls."""

import asyncio

import pytest

from deployments.core.admission.admission import ClassLimits
from deployments.core.admission.busy_rate import BusyRate
from deployments.core.admission.class_queues import ClassQueues, ClassSettings, Refused
from deployments.core.admission.wait_predictor import (
    COLD_START_WORK_PER_S,
    Prediction,
    WaitPredictor,
)
from deployments.core.priority import Priority
from tests.fakes import Clock

RT, NORMAL, BATCH = Priority.REALTIME, Priority.NORMAL, Priority.BATCH
RATE = 200.0  # items/s the fake model gets through
FLOOR_S = 0.05  # the fastest call


def settings(max_rt: int = 1000) -> dict[Priority, ClassSettings]:
    return {
        RT: ClassSettings(ClassLimits(max_rt), max_in_flight=1, target_s=0.1),
        NORMAL: ClassSettings(ClassLimits(10_000), max_in_flight=1, target_s=0.5),
        BATCH: ClassSettings(ClassLimits(10_000), max_in_flight=1, target_s=5.0),
    }


class Model:
    """Every class's downstream: `gate` holds calls open; each call moves the clock by
    its items over RATE."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.gate = asyncio.Event()
        self.gate.set()
        self.slowdown = 1.0

    async def send(
        self, jobs: list[list[str]], time_left: list[float | None], spent: list[float]
    ) -> list[str]:
        await self.gate.wait()
        self.clock.now += self.slowdown * sum(map(len, jobs)) / RATE
        return ["+".join(job) for job in jobs]


def warm_predictor(clock: Clock) -> WaitPredictor:
    predictor = WaitPredictor(BusyRate(window_s=0.5, min_work=10, clock=clock))
    for _ in range(20):
        predictor.rate.started()
        clock.now += 10 / RATE
        predictor.rate.ended(10)
    predictor.call_took(FLOOR_S)
    predictor.note_job(work=1, rows=1)  # an input weighs one unit here
    predictor.set_capacity(RATE)  # the replica's own figure agrees
    return predictor


def make(
    warm: bool = True, predict_wait: bool = True, max_rt: int = 1000
) -> tuple[ClassQueues[list[str], str], Model, Clock]:
    clock = Clock(100.0)
    model = Model(clock)
    queues: ClassQueues[list[str], str] = ClassQueues(
        lambda p: model.send,
        settings(max_rt),
        size_of=len,
        max_group_items=10_000,
        predictor=warm_predictor(clock) if warm else WaitPredictor(BusyRate(clock=clock)),
        predict_wait=predict_wait,
        clock=clock,
    )
    return queues, model, clock


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def fill(
    queues: ClassQueues[list[str], str], priority: Priority, limit: int = 10_000
) -> tuple[list[asyncio.Task[str]], Refused | None]:
    """Single-item requests of `priority` until one is refused (or `limit` were sent)."""
    tasks: list[asyncio.Task[str]] = []
    for i in range(limit):
        task = asyncio.create_task(queues.submit(priority, [str(i)], None))
        await settle()
        if task.done() and isinstance(task.exception(), Refused):
            exc = task.exception()
            assert isinstance(exc, Refused)
            return tasks, exc
        tasks.append(task)
    return tasks, None


async def drain(model: Model, tasks: list[asyncio.Task[str]]) -> None:
    model.gate.set()
    await asyncio.gather(*tasks)


async def test_admits_while_the_predicted_answer_fits_the_class_target() -> None:
    queues, model, _ = make()
    model.gate.clear()
    admitted, refused = await fill(queues, NORMAL)
    # floor 0.05 s + (ahead + 1) / 200 items/s <= 0.5 s: 90 inputs, the last with 89 ahead
    assert len(admitted) == 90
    assert refused is not None and refused.refusal.reason == "wait"
    assert (refused.refusal.status, refused.refusal.limit) == (429, 500)
    assert refused.refusal.retry_after_s == 1
    assert queues.stats()["classes"]["normal"]["refused"] == {"wait": 1}
    await drain(model, admitted)


async def test_realtime_counts_only_its_own_work_batch_counts_everything_above() -> None:
    queues, model, _ = make()
    model.gate.clear()
    normal, _ = await fill(queues, NORMAL, limit=80)
    realtime, refused = await fill(queues, RT)
    # 100 ms: 0.05 + n / 200 -> 10 realtime inputs, whatever normal work waits
    assert len(realtime) == 10 and refused is not None and refused.refusal.status == 503
    batch, refused = await fill(queues, BATCH)
    # 5 s: 0.05 + (90 ahead + n) / 200 <= 5 -> 900 in all ahead of the last
    assert len(batch) == 990 - 90 and refused is not None
    await drain(model, normal + realtime + batch)


async def test_a_deadline_shorter_than_the_target_is_the_budget() -> None:
    queues, model, _ = make()
    model.gate.clear()
    admitted, _ = await fill(queues, NORMAL, limit=30)
    loop_now = asyncio.get_running_loop().time()
    # 30 ahead: 0.05 + 31 / 200 = 0.205 s predicted; a 0.1 s deadline cannot be met
    late = asyncio.create_task(queues.submit(NORMAL, ["late"], loop_now + 0.1))
    await settle()
    assert isinstance(late.exception(), Refused)
    ok = asyncio.create_task(queues.submit(NORMAL, ["ok"], loop_now + 5))
    await drain(model, [*admitted, ok])


async def test_cold_start_admits_what_a_slow_rate_would_answer_in_time() -> None:
    queues, model, _ = make(warm=False)
    model.gate.clear()
    admitted, refused = await fill(queues, NORMAL)
    # the normal class's 0.5 s at the assumed rate; the first call is out, not queued
    assert len(admitted) == int(0.5 * COLD_START_WORK_PER_S)
    assert refused is not None and refused.refusal.reason == "wait"
    await drain(model, admitted)


async def test_with_the_switch_off_the_fixed_bounds_alone_decide() -> None:
    queues, model, _ = make(predict_wait=False)
    model.gate.clear()
    admitted, refused = await fill(queues, NORMAL, limit=3000)
    assert len(admitted) == 3000 and refused is None
    await drain(model, admitted)


async def test_the_fixed_bounds_stay_ceilings() -> None:
    queues, model, _ = make(max_rt=4)
    model.gate.clear()
    admitted, refused = await fill(queues, RT)
    # the prediction allows 10, the class's own bound 4 queued (+1 in the held call)
    assert len(admitted) == 5
    assert refused is not None and refused.refusal.reason == "queue_full"
    await drain(model, admitted)


async def test_answers_slower_than_predicted_tighten_admission() -> None:
    queues, model, _ = make()
    model.gate.clear()
    before, _ = await fill(queues, NORMAL)
    await drain(model, before)
    model.slowdown = 3.0  # the model now takes three times what the rate says
    for _ in range(6):  # rounds of admitted requests, each answered late
        model.gate.clear()
        batch, _ = await fill(queues, NORMAL)
        await drain(model, batch)
    model.gate.clear()
    after, refused = await fill(queues, NORMAL)
    assert refused is not None and len(after) < len(before) / 2
    await drain(model, after)


async def test_stats_show_the_prediction() -> None:
    queues, _, _ = make()
    predicted = queues.stats()["predicted_wait"]
    assert predicted["enabled"] is True
    assert predicted["work_per_busy_s"] == pytest.approx(RATE)
    assert predicted["service_rate_per_s"] == pytest.approx(RATE)
    assert predicted["call_floor_ms"] == 50.0
    assert predicted["fit"] == {"realtime": None, "normal": None, "batch": None}


async def test_the_prediction_weighs_work_and_the_bounds_count_inputs() -> None:
    """With `work_of`, a long input is many units of work ahead of the next request,
    while the fixed bounds still count it as one input."""
    clock = Clock(100.0)
    model = Model(clock)
    queues: ClassQueues[list[str], str] = ClassQueues(
        lambda p: model.send,
        settings(),
        size_of=len,
        work_of=lambda job: sum(len(text) for text in job),
        max_group_items=10_000,
        predictor=warm_predictor(clock),
        clock=clock,
    )
    queues.predictor.set_capacity(1.0)  # below the measured 200 a second, which decides
    model.gate.clear()
    long = asyncio.create_task(queues.submit(NORMAL, ["x" * 80], None))
    await settle()
    assert queues.work_ahead(NORMAL) == 80 and queues.queued_items()[NORMAL] <= 1
    # 0.05 + (80 + 19) / 200 = 0.545 s: over normal's 500 ms, though one input is ahead
    refused = asyncio.create_task(queues.submit(NORMAL, ["y" * 19], None))
    await settle()
    assert isinstance(refused.exception(), Refused)
    ok = asyncio.create_task(queues.submit(NORMAL, ["z" * 10], None))  # 0.5 s: fits
    await settle()
    assert not ok.done()
    await drain(model, [long, ok])
    assert queues.work_ahead(NORMAL) == 0


class BlindPredictor(WaitPredictor):
    """Learns nothing from answers: what moves admission is the target's aim alone."""

    def observe(self, priority: Priority, prediction: Prediction, measured_s: float) -> None:
        pass


async def test_answers_past_the_target_shrink_the_share_of_it_admission_aims_at() -> None:
    clock = Clock(100.0)
    model = Model(clock)
    predictor = BlindPredictor(BusyRate(clock=clock))
    predictor.call_took(FLOOR_S)
    predictor.note_job(work=1, rows=1)
    predictor.set_capacity(RATE)
    queues: ClassQueues[list[str], str] = ClassQueues(
        lambda p: model.send,
        settings(),
        size_of=len,
        max_group_items=10_000,
        predictor=predictor,
        clock=clock,
    )
    model.gate.clear()
    before, _ = await fill(queues, NORMAL)
    model.slowdown = 3.0  # 90 admitted, 89 of them answered past 0.5 s
    await drain(model, before)
    model.slowdown = 1.0
    clock.now += 1.0
    model.gate.clear()
    after, refused = await fill(queues, NORMAL)
    aim = queues.stats()["predicted_wait"]["target_aim"]["normal"]
    assert aim["cuts"] == 1 and aim["aim"] == pytest.approx(0.7)
    # the budget is now 0.7 x 0.5 s: floor + n / 200 <= 0.35 (the floor is the fastest
    # call, 15 ms since the slow round), 66 inputs against 90
    floor = predictor.floor_s()
    assert floor is not None and refused is not None
    assert len(after) == pytest.approx((0.35 - floor) * RATE, abs=1)
    assert refused.refusal.limit == 350
    await drain(model, after)


async def test_requests_still_waiting_past_their_prediction_tighten_admission_at_once() -> None:
    """No answer has come back to teach the fit, but the oldest admitted request is already
    late: everything behind it will be at least as late, and admission says so."""
    queues, model, clock = make()
    model.gate.clear()
    admitted, _ = await fill(queues, NORMAL, limit=10)
    clock.now += 0.3  # the first was predicted at 0.05 + 1 / 200 s: 0.245 s late now
    assert queues.stats()["predicted_wait"]["late_ms"]["normal"] == pytest.approx(245.0)
    # 0.05 + 11 / 200 + 0.245 = 0.35 s: still within normal's 0.5 s
    fits = asyncio.create_task(queues.submit(NORMAL, ["fits"], None))
    await settle()
    assert not fits.done()
    clock.now += 0.2  # 0.445 s late: 0.105 + 0.445 is past 0.5 s, with nothing answered
    late = asyncio.create_task(queues.submit(NORMAL, ["late"], None))
    await settle()
    assert isinstance(late.exception(), Refused) and late.exception().refusal.reason == "wait"
    # Realtime sits above normal at the replica's gate: normal's lateness is not its own.
    realtime = asyncio.create_task(queues.submit(RT, ["rt"], None))
    await settle()
    assert not realtime.done()
    await drain(model, [*admitted, fits, realtime])
    assert queues.stats()["predicted_wait"]["late_ms"]["normal"] == 0.0
