"""Replicas of a generation model that did not answer the replica watch's question in time.

A replica that hangs (stopped, a wedged event loop) does not die: Serve keeps routing
calls to it until its health check gives up (`health_check_timeout_s`, 30 s), and every
call sent there waits. The replica watch (replica_watch.py) asks the model `engine_alive`
when a call waits too long for its first token; the generation router sends that question
to one replica and notes which here, by the question's key. When no answer comes in time,
that replica is passed over: the router leaves it out of its candidates while any other
runs (a standby, or another serving replica), so the next calls go there, and the watch
tells the calls waiting on it to send again.

A mark lasts `PASSED_OVER_FOR_S`: longer than Serve takes to replace a replica that does
not answer its health check, so a hung replica is gone before it would be tried again; one
that was only slow (a long pause on a busy machine) takes calls again after it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ray.serve.request_router import ReplicaID, RunningReplica

PASSED_OVER_FOR_S = 60.0
# Questions remembered per process; one never settled (its caller gone) is forgotten.
REMEMBERED_QUESTIONS = 1024


@dataclass(frozen=True)
class Question:
    replica_id: ReplicaID
    others: int  # replicas not passed over that could answer instead
    full: bool  # Serve last saw the replica at its max_ongoing_requests: busy, not hung


class SilentReplicas:
    def __init__(
        self,
        passed_over_for_s: float = PASSED_OVER_FOR_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._for_s = passed_over_for_s
        self._clock = clock
        self._asked: OrderedDict[str, Question] = OrderedDict()
        self._since: dict[ReplicaID, float] = {}  # passed-over replica -> when

    def asked(
        self, key: str, asked: RunningReplica, candidates: list[RunningReplica], full: bool
    ) -> None:
        """The question `key` went to `asked`, one of `candidates` (Serve may choose again
        on a retry: the last choice is the one that counts). `full`: Serve's router last
        saw `asked` with no free slot, so the question waits for one there."""
        others = [
            r
            for r in candidates
            if r.replica_id != asked.replica_id and not self.passed_over(r.replica_id)
        ]
        self._asked[key] = Question(asked.replica_id, len(others), full)
        self._asked.move_to_end(key)
        while len(self._asked) > REMEMBERED_QUESTIONS:
            self._asked.popitem(last=False)

    def answered(self, key: str) -> None:
        self._asked.pop(key, None)

    def unanswered(self, key: str) -> bool:
        """Passes over the replica that `key` went to. True when that replica was taking
        calls until now and another can take them: the calls waiting on it may send again.
        A replica that was full is not passed over: it is busy, not hung."""
        question = self._asked.pop(key, None)
        if question is None or question.full:
            return False
        newly = not self.passed_over(question.replica_id)
        self._since[question.replica_id] = self._clock()
        return newly and question.others > 0

    def passed_over(self, replica_id: ReplicaID) -> bool:
        since = self._since.get(replica_id)
        if since is None:
            return False
        if self._clock() - since >= self._for_s:
            del self._since[replica_id]
            return False
        return True

    def live(self, candidates: list[RunningReplica]) -> list[RunningReplica]:
        """`candidates` less the replicas passed over; all of them if none would be left
        (a replica that may answer beats none)."""
        if not self._since:
            return candidates
        live = [r for r in candidates if not self.passed_over(r.replica_id)]
        current = {r.replica_id for r in candidates}
        deployments = {r.replica_id.deployment_id for r in candidates}
        for gone in [
            r for r in self._since if r.deployment_id in deployments and r not in current
        ]:  # replaced by Serve
            del self._since[gone]
        return live or candidates


# One per process, reached through this module (the router's module is pickled by value).
SILENT = SilentReplicas()
