"""Open-loop HTTP/1.1 client: requests leave on a fixed schedule, whatever the server does.

A closed loop slows down with the server and so hides a slow server's latency (coordinated
omission). Here request k is due at ``start + k / rate``, is sent then on an idle keep-alive
connection from a pool (or a new one), and its latency runs from when it was due, so a
client that fell behind still charges the wait to the server. A request belongs to the
measured window when it was due inside it, and every such request is awaited, so slow ones
at the end of the window still count.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field

from bench.http_response import RETRY_STATUSES, read_response
from bench.loadgen import LoadResult, _encode_requests, _State

_CONNECTION_ERRORS = (
    OSError,  # TimeoutError too
    EOFError,
    asyncio.IncompleteReadError,
    asyncio.LimitOverrunError,
    ValueError,
)
_TRACED_BODY_BYTES = 200


@dataclass(frozen=True)
class TracedRequest:
    """One request of a traced run, times on time.perf_counter(): due on the schedule, sent
    (the client's own lag is sent - due), answered (the server's part is answered - sent)."""

    due: float
    sent: float
    answered: float
    status: int  # 0: no answer (a connection error or the timeout)
    refusal: bytes = b""  # the first bytes of a non-200 body: who refused it


@dataclass
class OpenLoopResult(LoadResult):
    non_ok_total: int = 0  # non-200 answers and errors over the whole run, warmup included
    max_send_lag_ms: float = 0.0  # how far behind schedule the client sent, at worst
    # Over the whole run, warmup included: every answer's status, the requests that got no
    # answer (connection error or timeout), and 429/503 answers without Retry-After.
    all_status_counts: dict[int, int] = field(default_factory=dict)
    no_answer_total: int = 0
    refusals_without_retry_after: int = 0
    # Seconds from due to answer of every 429/503, over the whole run: how fast a refusal is.
    refusal_latencies_s: list[float] = field(default_factory=list)
    # The first body of each status other than 200/429/503: what an unexpected answer said.
    unexpected_bodies: dict[int, bytes] = field(default_factory=dict)

    def within(self, seconds: float) -> int:
        """200s in the measured window answered within `seconds` (goodput's count)."""
        return sum(1 for latency in self.latencies_s if latency <= seconds)

    def refusal_p(self, q: float) -> float:
        """Nearest-rank percentile `q` (0-100) of the refusals' latencies, in ms (0: none)."""
        ordered = sorted(self.refusal_latencies_s)
        if not ordered:
            return 0.0
        rank = max(1, math.ceil(q / 100 * len(ordered)))
        return 1000 * ordered[min(rank, len(ordered)) - 1]


class _Pool:
    """Idle keep-alive connections; a request takes one or opens a new one."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self.idle:
            reader, writer = self.idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return await asyncio.open_connection(self.host, self.port)

    def close(self) -> None:
        for _, writer in self.idle:
            writer.close()
        self.idle.clear()


class _Run:
    def __init__(
        self,
        state: _State,
        pool: _Pool,
        timeout_s: float,
        trace: list[TracedRequest] | None = None,
    ) -> None:
        self.state, self.pool, self.timeout_s = state, pool, timeout_s
        self.trace = trace
        self.non_ok_total = 0
        self.all_status_counts: dict[int, int] = {}
        self.no_answer_total = 0
        self.refusals_without_retry_after = 0
        self.refusal_latencies_s: list[float] = []
        self.unexpected_bodies: dict[int, bytes] = {}

    async def one(self, request: bytes, due: float) -> None:
        writer: asyncio.StreamWriter | None = None
        sent = due
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await self.pool.take()
                sent = time.perf_counter()
                writer.write(request)
                status, body, keep_alive, retry_after, _ = await read_response(reader)
        except _CONNECTION_ERRORS as exc:
            self.non_ok_total += 1
            self.no_answer_total += 1
            if writer is not None:
                writer.close()
            self.state.record_error(due, exc)
            if self.trace is not None:
                self.trace.append(TracedRequest(due, sent, time.perf_counter(), 0))
            return
        done = time.perf_counter()
        if self.trace is not None:
            refusal = b"" if status == 200 else body[:_TRACED_BODY_BYTES]
            self.trace.append(TracedRequest(due, sent, done, status, refusal))
        if status != 200:
            self.non_ok_total += 1
        self.all_status_counts[status] = self.all_status_counts.get(status, 0) + 1
        if status not in (200, *RETRY_STATUSES):
            self.unexpected_bodies.setdefault(status, body[:300])
        if status in RETRY_STATUSES:
            self.refusal_latencies_s.append(done - due)
            if retry_after is None:
                self.refusals_without_retry_after += 1
        # Placed in the window by when it was due, not when it finished.
        self.state.record(due, done - due, status, body, retry_after is not None)
        if keep_alive:
            self.pool.idle.append((reader, writer))
        else:
            writer.close()


async def run_open_loop(
    host: str,
    port: int,
    path: str,
    bodies: list[bytes],
    rate_per_s: float,
    duration_s: float,
    warmup_s: float = 2.0,
    headers: dict[str, str] | None = None,
    request_timeout_s: float = 60.0,
    trace: list[TracedRequest] | None = None,
) -> OpenLoopResult:
    """Send ``rate_per_s`` requests a second for ``warmup_s`` + ``duration_s`` seconds,
    cycling through ``bodies``, and measure the requests due in the last ``duration_s``.
    With ``trace``, every request of the run is appended to it as it ends."""
    if not bodies or rate_per_s <= 0:
        raise ValueError("need bodies and a positive rate")
    requests = _encode_requests(host, port, path, bodies, headers)
    start = time.perf_counter()
    state = _State(start + warmup_s, start + warmup_s + duration_s)
    run = _Run(state, _Pool(host, port), request_timeout_s, trace)
    tasks: set[asyncio.Task[None]] = set()
    max_lag = 0.0
    cpu0 = time.process_time()
    try:
        for k in range(round((warmup_s + duration_s) * rate_per_s)):
            due = start + k / rate_per_s
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            max_lag = max(max_lag, time.perf_counter() - due)
            task = asyncio.create_task(run.one(requests[k % len(requests)], due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(tasks)  # each one is bounded by request_timeout_s
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        run.pool.close()
    return OpenLoopResult(
        requests=state.requests,
        failures=state.failures,
        texts=state.requests,
        seconds=duration_s,
        latencies_s=state.latencies_s,
        status_counts=state.status_counts,
        first_error=state.first_error,
        client_cpu_s=time.process_time() - cpu0,
        non_ok_total=run.non_ok_total,
        max_send_lag_ms=max_lag * 1000,
        all_status_counts=run.all_status_counts,
        no_answer_total=run.no_answer_total,
        refusals_without_retry_after=run.refusals_without_retry_after,
        refusal_latencies_s=run.refusal_latencies_s,
        unexpected_bodies=run.unexpected_bodies,
    )
