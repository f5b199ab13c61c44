"""A replica that hangs is passed over (ingress/calls/silent_replicas.py): the question the
replica watch sent it goes unanswered, the router leaves it out while another replica runs,
and the calls that waited on it are sent again, to the replica that answers. With fakes of
Serve's replicas routed as the generation router routes them; served:
tests/reliability/test_replica_kill.py, where the default app's serving replica is stopped
with SIGSTOP and its standby answers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from ray.serve._private.common import DeploymentID, ReplicaID

from deployments.core.priority import Priority
from deployments.core.protocol import GenerationChunk, GenerationJob
from deployments.errors import NotReady
from deployments.ingress.calls import generation_call
from deployments.ingress.calls.generation_call import GenerationCall
from deployments.ingress.calls.replica_watch import ReplicaWatch
from deployments.ingress.calls.silent_replicas import SilentReplicas
from deployments.ingress.calls.standby import replica_roles
from deployments.ingress.calls.stop_note_router import RUNS
from deployments.ingress.tasks.generation import run_whole

FAST = {"probe_timeout_s": 0.05, "probe_every_s": 0.02, "stall_probe_s": 0.1}


@dataclass(frozen=True)
class Replica:
    replica_id: ReplicaID


def replica(unique_id: str, deployment: str = "generate") -> Any:
    return Replica(ReplicaID(unique_id, DeploymentID(name=deployment, app_name="tributary")))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_unanswered_question_passes_its_replica_over_while_another_runs() -> None:
    silent = SilentReplicas()
    a, b = replica("a"), replica("b")
    silent.asked("q1", a, [a, b], full=False)
    assert silent.unanswered("q1")  # b can take a's calls: those waiting on a send again
    assert silent.live([a, b]) == [b]
    # b's question answered: nothing changes.
    silent.asked("q2", b, [a, b], full=False)
    silent.answered("q2")
    assert silent.live([a, b]) == [b]


def test_a_replica_that_may_answer_beats_none() -> None:
    silent = SilentReplicas()
    a = replica("a")
    silent.asked("q", a, [a], full=False)
    assert not silent.unanswered("q")  # no other replica: nothing to send again to
    assert silent.live([a]) == [a]
    b = replica("b")
    silent.asked("q2", b, [a, b], full=False)
    assert not silent.unanswered("q2")  # a is passed over too: no other that answers
    assert silent.live([a, b]) == [a, b]


def test_a_question_passes_over_a_replica_once_and_unknown_questions_nothing() -> None:
    silent = SilentReplicas()
    a, b, c = replica("a"), replica("b"), replica("c")
    silent.asked("q1", a, [a, b, c], full=False)
    silent.asked("q2", a, [a, b, c], full=False)
    assert silent.unanswered("q1")
    assert not silent.unanswered("q2")  # already passed over: the calls were told
    assert not silent.unanswered("never asked")
    assert silent.live([a, b, c]) == [b, c]


def test_a_mark_lasts_its_time_and_goes_with_its_replica() -> None:
    clock = Clock()
    silent = SilentReplicas(passed_over_for_s=60, clock=clock)
    a, b = replica("a"), replica("b")
    silent.asked("q", a, [a, b], full=False)
    silent.unanswered("q")
    clock.now = 59
    assert silent.live([a, b]) == [b]
    clock.now = 60  # a slow replica, not a hung one (Serve would have replaced that)
    assert silent.live([a, b]) == [a, b]
    silent.asked("q", a, [a, b], full=False)
    silent.unanswered("q")
    assert silent.live([b]) == [b]  # Serve replaced a: forgotten
    assert not silent.passed_over(a.replica_id)


def test_one_models_router_forgets_only_its_own_replaced_replicas() -> None:
    silent = SilentReplicas()
    a, b = replica("a"), replica("b")
    other_model = [replica("x", "generate-other"), replica("y", "generate-other")]
    silent.asked("q", a, [a, b], full=False)
    silent.unanswered("q")
    assert silent.live(other_model) == other_model
    assert silent.passed_over(a.replica_id)  # not forgotten by another model's router


def test_a_replica_seen_full_is_busy_not_hung() -> None:
    """Serve's router holds a question for a replica at its max_ongoing_requests until a
    slot frees: left unanswered, it is not passed over (the model is refused meanwhile, as
    when no replica answers)."""
    silent = SilentReplicas()
    a, b = replica("a"), replica("b")
    silent.asked("q", a, [a, b], full=True)
    assert not silent.unanswered("q")
    assert silent.live([a, b]) == [a, b]


def test_the_last_choice_of_a_question_counts() -> None:
    """Serve chooses again when the replica it chose does not say its queue length."""
    silent = SilentReplicas()
    a, b = replica("a"), replica("b")
    silent.asked("q", a, [a, b], full=False)
    silent.asked("q", b, [a, b], full=False)
    assert silent.unanswered("q")
    assert silent.live([a, b]) == [a]


class Stream:
    """A streaming call sent to one replica: a chunk at once while the replica runs, and
    none once it hangs; `chunks` of them, the last with a finish reason."""

    def __init__(self, model: Model, replica: str, chunks: int) -> None:
        self.model = model
        self.replica = replica
        self.left = chunks
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        if self.left == 0:
            raise StopAsyncIteration
        await self.model.running[self.replica].wait()
        self.left -= 1
        reason = "length" if self.left == 0 else None
        return GenerationChunk(
            text="hi", finish_reason=reason, prompt_tokens=1, completion_tokens=1
        )

    def cancel(self) -> None:
        self.cancelled = True


class Model:
    """A generation model's handle with replicas "a", "b", ... of which the first
    `serving` by id take calls (in turn) and questions (the first of them), routed as the
    generation router routes; a question notes where it went, an accepted call where it
    runs. A hung replica answers nothing until it goes on."""

    def __init__(
        self,
        silent: SilentReplicas,
        hung: set[str],
        chunks: int = 1,
        replicas: str = "ab",
        serving: int = 1,
    ) -> None:
        self.silent = silent
        self.chunks = chunks
        self.replicas = [replica(name) for name in replicas]
        self.running = {name: asyncio.Event() for name in replicas}
        for name in replicas:
            self.hang(name) if name in hung else self.go_on(name)
        self.serving_count = serving
        self.sent_to: list[str] = []
        self.streams: list[Stream] = []
        self.generate = self

    def hang(self, name: str) -> None:
        self.running[name].clear()

    def go_on(self, name: str) -> None:
        self.running[name].set()

    def hung(self, name: str) -> bool:
        return not self.running[name].is_set()

    def serving(self) -> list[Any]:
        return replica_roles(self.silent.live(self.replicas), self.serving_count).serving

    async def probe(self, key: str) -> bool:
        asked = self.serving()[0]
        self.silent.asked(key, asked, self.replicas, full=False)
        await self.running[asked.replica_id.unique_id].wait()
        return True

    def options(self, **_: Any) -> Model:
        return self

    def remote(self, priority: str, job: GenerationJob, time_left_s: float, key: str) -> Stream:
        serving = self.serving()
        to = serving[len(self.sent_to) % len(serving)]
        name = to.replica_id.unique_id
        self.sent_to.append(name)
        if not self.hung(name):  # it accepted the call: the router notes where it runs
            RUNS.ran(key, to.replica_id, key)
        self.streams.append(Stream(self, name, self.chunks))
        return self.streams[-1]


def job(whole: bool = False) -> GenerationJob:
    return GenerationJob(request_id="r", prompt="hi", messages=None, max_tokens=4, whole=whole)


async def test_calls_waiting_on_a_hung_replica_are_sent_again_to_the_standby() -> None:
    silent = SilentReplicas()
    model = Model(silent, hung={"a"})
    watch = ReplicaWatch("llm", model.probe, silent=silent, **FAST)
    calls = [GenerationCall("llm", model, Priority.NORMAL, 10, watch) for _ in range(3)]
    started = time.monotonic()
    firsts = await asyncio.gather(*(call.start(job()) for call in calls))
    assert [first.text for first in firsts] == ["hi"] * 3
    assert time.monotonic() - started < 1  # a stall period and a question, not the deadline
    assert model.sent_to == ["a"] * 3 + ["b"] * 3
    assert not watch.down  # b answered the question asked again at once
    # Each call's first send is ended (the hung replica's read never lands: cancelled).
    for stream in model.streams[:3]:
        await until(lambda stream=stream: stream.cancelled)
    # From now on calls go to b at once.
    await GenerationCall("llm", model, Priority.NORMAL, 10, watch).start(job())
    assert model.sent_to[-1] == "b"


async def test_without_another_replica_a_hang_is_refused_as_before() -> None:
    silent = SilentReplicas()
    model = Model(silent, hung={"a", "b"})
    watch = ReplicaWatch("llm", model.probe, silent=silent, **FAST)
    with pytest.raises(NotReady):
        await GenerationCall("llm", model, Priority.NORMAL, 10, watch).start(job())
    assert watch.down
    # a was passed over for b, which hung too: each call was sent twice at most.
    assert model.sent_to == ["a", "b"]


async def test_a_call_mid_run_on_a_hung_replica_fails_and_one_on_a_live_replica_goes_on() -> None:
    """Past its first token a call cannot be sent again (a stream has shown its client
    tokens): on a replica passed over it fails with a 503, instead of waiting until Serve
    replaces the replica; a call on another replica is left alone."""
    silent = SilentReplicas()
    model = Model(silent, hung=set(), chunks=3, replicas="abc", serving=2)
    watch = ReplicaWatch("llm", model.probe, silent=silent, **FAST)
    on_a, on_b = (GenerationCall("llm", model, Priority.NORMAL, 10, watch) for _ in "ab")
    await on_a.start(job())
    await on_b.start(job())
    assert model.sent_to == ["a", "b"]
    model.hang("a")
    model.hang("b")  # b only pauses: its call waits through a's pass-over
    # No new call comes to wait for a first token: the watch finds the calls mid-way
    # that read nothing for a stall period, and asks.
    rests = asyncio.gather(_rest(on_a), _rest(on_b), return_exceptions=True)
    await until(lambda: silent.passed_over(model.replicas[0].replica_id), step_s=0.001)
    model.go_on("b")
    failed_on_a, answered_on_b = await rests
    assert isinstance(failed_on_a, NotReady) and failed_on_a.retry_after_s
    assert answered_on_b == ["hi", "hi"]
    assert [r.replica_id.unique_id for r in model.serving()] == ["b", "c"]


class Live:
    """What run_whole needs of a LiveGeneration: the call, its first chunk, a charge."""

    def __init__(self, call: GenerationCall, first: GenerationChunk) -> None:
        self.call = call
        self.first = first
        self.charges = 0

    @contextmanager
    def charged(self) -> Iterator[None]:
        self.charges += 1
        yield


async def test_a_whole_completion_whose_replica_hangs_mid_way_runs_again_on_the_standby() -> None:
    """A whole completion's client has seen nothing past its first token either: on a
    replica passed over mid-way it runs again from the start, on the replica that answers,
    instead of ending with the 503 a stream gets."""
    silent = SilentReplicas()
    model = Model(silent, hung=set(), chunks=3)
    watch = ReplicaWatch("llm", model.probe, silent=silent, **FAST)

    async def start() -> Any:
        call = GenerationCall("llm", model, Priority.NORMAL, 10, watch)
        first = await call.start(job(whole=True))
        if model.sent_to == ["a"]:
            model.hang("a")  # after its first chunk
        return Live(call, first)

    started = time.monotonic()
    live, text, last = await run_whole(start)
    assert text == "hihihi" and last.finish_reason == "length"
    assert model.sent_to == ["a", "b"]
    assert live.call is not None and live.charges == 1  # the second run's, settled alone
    assert time.monotonic() - started < 1


async def test_a_pass_over_told_as_the_first_item_landed_is_a_503_at_the_next_read() -> None:
    """The watch decides what to tell a call by whether its first item came; told in the
    moment the item landed but before `start` took it, the call learns of the pass-over at
    its next read: the 503 of a call past its first token, not a model failure (500)."""
    silent = SilentReplicas()
    model = Model(silent, hung=set(), chunks=3)
    watch = ReplicaWatch("llm", model.probe, silent=silent, **FAST)
    call = GenerationCall("llm", model, Priority.NORMAL, 10, watch)
    await call.start(job())
    call._reads.interrupt(generation_call._SendAgain())  # type: ignore[union-attr]
    with pytest.raises(NotReady) as ended:
        await _rest(call)
    assert ended.value.status == 503 and ended.value.retry_after_s


async def _rest(call: GenerationCall) -> list[str]:
    return [chunk.text async for chunk in call.rest()]


async def until(condition: Any, timeout_s: float = 2, step_s: float = 0.01) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(step_s)
