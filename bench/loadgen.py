"""Closed-loop HTTP/1.1 load generator on raw asyncio streams.

The load generator shares the CPU with the server under test, so it avoids
general-purpose HTTP clients: requests are pre-encoded bytes and responses are
parsed just enough to find the status and where the body ends.
"""

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import orjson
from tqdm import tqdm

from bench.http_response import RETRY_STATUSES, read_response
from bench.texts import sentences

# Keeps a refused or closing server from turning workers into a busy loop.
_RETRY_DELAY_S = 0.05
_DRAIN_TIMEOUT_S = 30.0
_TICK_S = 0.25
_ERROR_SNIPPET = 300
_OK = 200


@dataclass
class LoadResult:
    """Counts cover the window after warmup; ``requests`` counts 200 responses,
    ``failures`` every other answer or error, ``refused`` those of them that were a
    429/503 with a Retry-After: the server's admission saying when to come back, not an
    error."""

    requests: int
    failures: int
    texts: int
    seconds: float
    latencies_s: list[float]
    status_counts: dict[int, int]
    first_error: str | None  # may come from the warmup too, which is often the interesting one
    client_cpu_s: float = 0.0  # this process's CPU time during the window
    refused: int = 0

    @property
    def errors(self) -> int:
        """Failures that were not a refusal with a Retry-After."""
        return self.failures - self.refused

    @property
    def req_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds if self.seconds > 0 else 0.0

    @cached_property
    def _sorted_latencies(self) -> list[float]:
        return sorted(self.latencies_s)

    def p(self, q: float) -> float:
        """Nearest-rank latency percentile ``q`` (0-100) of 200 responses, in ms."""
        lat = self._sorted_latencies
        if not lat:
            return math.nan
        rank = max(1, math.ceil(q / 100 * len(lat)))
        return lat[min(rank, len(lat)) - 1] * 1000

    @property
    def p50_ms(self) -> float:
        return self.p(50)

    @property
    def p95_ms(self) -> float:
        return self.p(95)

    @property
    def p99_ms(self) -> float:
        return self.p(99)

    @property
    def cpu_us_per_request(self) -> float:
        done = self.requests + self.failures
        return self.client_cpu_s / done * 1e6 if done else math.nan

    def summary(self) -> str:
        statuses = ",".join(f"{k}:{v}" for k, v in sorted(self.status_counts.items()))
        line = (
            f"req/s={self.req_per_s:.1f} texts/s={self.texts_per_s:.1f} "
            f"p50={self.p50_ms:.1f}ms p95={self.p95_ms:.1f}ms p99={self.p99_ms:.1f}ms "
            f"ok={self.requests} fail={self.failures} refused={self.refused} status={{{statuses}}} "
            f"window={self.seconds:.1f}s client_cpu={self.client_cpu_s:.2f}s "
            f"({self.cpu_us_per_request:.0f}us/req)"
        )
        if self.first_error:
            line += f" first_error={self.first_error!r}"
        return line


def refused_share(results: Iterable[LoadResult]) -> float:
    """Of all the answers of `results`, the share that were refusals with a Retry-After."""
    answered = refused = 0
    for result in results:
        answered += result.requests + result.failures
        refused += result.refused
    return refused / answered if answered else 0.0


@dataclass
class _State:
    window_start: float
    window_end: float
    completed: int = 0  # includes warmup and failures; drives the progress bar
    requests: int = 0
    failures: int = 0
    refused: int = 0
    latencies_s: list[float] = field(default_factory=list)
    status_counts: dict[int, int] = field(default_factory=dict)
    first_error: str | None = None

    def record(
        self, done_at: float, latency_s: float, status: int, body: bytes, retry_after: bool
    ) -> None:
        self.completed += 1
        if status != _OK and self.first_error is None:
            self.first_error = f"HTTP {status}: {body[:_ERROR_SNIPPET].decode(errors='replace')}"
        if not self.window_start <= done_at < self.window_end:
            return
        self.status_counts[status] = self.status_counts.get(status, 0) + 1
        if status == _OK:
            self.requests += 1
            self.latencies_s.append(latency_s)
        else:
            self.failures += 1
            if status in RETRY_STATUSES and retry_after:
                self.refused += 1

    def record_error(self, done_at: float, exc: BaseException) -> None:
        self.completed += 1
        if self.first_error is None:
            self.first_error = f"{type(exc).__name__}: {exc}"[:_ERROR_SNIPPET]
        if self.window_start <= done_at < self.window_end:
            self.failures += 1


async def _worker(
    state: _State,
    host: str,
    port: int,
    requests: list[bytes],
    offset: int,
    honor_retry_after: bool = True,
) -> None:
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    i = offset
    try:
        while time.perf_counter() < state.window_end:
            request = requests[i % len(requests)]
            i += 1
            started = time.perf_counter()
            try:
                if reader is None or writer is None:
                    reader, writer = await asyncio.open_connection(host, port)
                # No drain(): one request in flight per connection bounds the buffer.
                writer.write(request)
                answer = await read_response(reader)
            except (
                OSError,
                EOFError,
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
                ValueError,
            ) as exc:
                state.record_error(time.perf_counter(), exc)
                if writer is not None:
                    writer.close()
                reader = writer = None
                await asyncio.sleep(_RETRY_DELAY_S)
                continue
            done = time.perf_counter()
            status = answer.status
            state.record(done, done - started, status, answer.body, answer.retry_after is not None)
            if not answer.keep_alive:
                writer.close()
                reader = writer = None
            if honor_retry_after and status in RETRY_STATUSES:
                wait = answer.wait_s()
                if wait is not None:  # as an SDK would; never past the window
                    await asyncio.sleep(min(wait, max(0.0, state.window_end - done)))
    finally:
        if writer is not None:
            writer.close()


async def _window_cpu(state: _State) -> float:
    await asyncio.sleep(max(0.0, state.window_start - time.perf_counter()))
    cpu0 = time.process_time()
    await asyncio.sleep(max(0.0, state.window_end - time.perf_counter()))
    return time.process_time() - cpu0


async def _progress(state: _State, run_start: float) -> None:
    total = state.window_end - run_start
    with tqdm(
        total=round(total, 1),
        file=sys.stderr,
        bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f}s{postfix}",
        dynamic_ncols=True,
        leave=False,
    ) as bar:
        last_t, last_n = run_start, 0
        while True:
            await asyncio.sleep(_TICK_S)
            now = time.perf_counter()
            rate = (state.completed - last_n) / (now - last_t)
            last_t, last_n = now, state.completed
            bar.n = round(min(now - run_start, total), 1)
            phase = "warmup" if now < state.window_start else "measure"
            bar.set_postfix_str(f"{phase} {rate:.0f} req/s fail={state.failures}", refresh=False)
            bar.refresh()


def _encode_requests(
    host: str, port: int, path: str, bodies: list[bytes], headers: dict[str, str] | None
) -> list[bytes]:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    return [
        (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n"
        ).encode()
        + body
        for body in bodies
    ]


async def run_closed_loop(
    host: str,
    port: int,
    path: str,
    bodies: list[bytes],
    texts_per_request: int,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 2.0,
    progress: bool = True,
    headers: dict[str, str] | None = None,
    honor_retry_after: bool = True,
) -> LoadResult:
    """Keep ``concurrency`` connections busy for ``warmup_s`` + ``duration_s`` seconds.

    Each connection sends one request at a time, cycling through ``bodies``.
    Requests still in flight when the window closes are awaited (up to a grace
    period) so the server is idle for the next run, but are not counted. A connection
    answered 429/503 with a Retry-After waits that long before its next request, as the
    OpenAI and Cohere SDKs do; ``honor_retry_after=False`` retries at once, a client that
    ignores the server (on this machine's shared cores its refusals then take the CPU the
    model needed: docs/benchmarks.md, "Clients that ignore Retry-After").
    """
    if not bodies:
        raise ValueError("bodies must not be empty")
    requests = _encode_requests(host, port, path, bodies, headers)
    run_start = time.perf_counter()
    state = _State(run_start + warmup_s, run_start + warmup_s + duration_s)
    cpu_task = asyncio.create_task(_window_cpu(state))
    side_tasks: list[asyncio.Task[None]] = []
    if progress:
        side_tasks.append(asyncio.create_task(_progress(state, run_start)))
    step = max(1, len(requests) // concurrency)
    workers = [
        asyncio.create_task(_worker(state, host, port, requests, n * step, honor_retry_after))
        for n in range(concurrency)
    ]
    try:
        client_cpu_s = await cpu_task
        _, pending = await asyncio.wait(workers, timeout=_DRAIN_TIMEOUT_S)
    finally:
        for task in [*workers, *side_tasks, cpu_task]:
            task.cancel()
        await asyncio.gather(*workers, *side_tasks, cpu_task, return_exceptions=True)
    for task in workers:
        error = None if task in pending else task.exception()
        if error is not None:
            raise error  # a bug in the client, not a server failure
    return LoadResult(
        requests=state.requests,
        failures=state.failures,
        refused=state.refused,
        texts=state.requests * texts_per_request,
        seconds=duration_s,
        latencies_s=state.latencies_s,
        status_counts=state.status_counts,
        first_error=state.first_error,
        client_cpu_s=client_cpu_s,
    )


def embedding_bodies(texts: list[str], per_request: int, model: str, n_bodies: int) -> list[bytes]:
    """OpenAI-style embedding request bodies, walking through ``texts`` round-robin."""
    if not texts or per_request < 1:
        raise ValueError("need at least one text and per_request >= 1")
    bodies = []
    for b in range(n_bodies):
        batch = [texts[(b * per_request + j) % len(texts)] for j in range(per_request)]
        payload: str | list[str] = batch[0] if per_request == 1 else batch
        bodies.append(orjson.dumps({"model": model, "input": payload}))
    return bodies


def _run_loop(main: Coroutine[Any, Any, LoadResult]) -> LoadResult:
    try:
        # A cheaper event loop leaves more CPU to the server under test.
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--path", default="/v1/embeddings")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--texts-per-request", type=int, default=1)
    parser.add_argument(
        "--duration", type=float, default=20.0, help="measured seconds, after warmup"
    )
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--model", default="all-MiniLM-L6-v2")
    parser.add_argument(
        "--bodies",
        type=int,
        default=256,
        help="distinct request bodies to cycle through",
    )
    parser.add_argument("--header", action="append", default=[], metavar="NAME:VALUE")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    headers = dict(h.split(":", 1) for h in args.header)
    bodies = embedding_bodies(sentences(2000), args.texts_per_request, args.model, args.bodies)
    result = _run_loop(
        run_closed_loop(
            args.host,
            args.port,
            args.path,
            bodies,
            args.texts_per_request,
            args.concurrency,
            args.duration,
            args.warmup,
            progress=not args.no_progress,
            headers={k.strip(): v.strip() for k, v in headers.items()},
        )
    )
    if args.json:
        summary = {
            "concurrency": args.concurrency,
            "texts_per_request": args.texts_per_request,
            "req_per_s": round(result.req_per_s, 2),
            "texts_per_s": round(result.texts_per_s, 2),
            "p50_ms": round(result.p50_ms, 3),
            "p95_ms": round(result.p95_ms, 3),
            "p99_ms": round(result.p99_ms, 3),
            "requests": result.requests,
            "failures": result.failures,
            "status_counts": result.status_counts,
            "client_cpu_s": round(result.client_cpu_s, 3),
            "first_error": result.first_error,
        }
        print(orjson.dumps(summary, option=orjson.OPT_NON_STR_KEYS).decode())
    else:
        print(f"c={args.concurrency} tpr={args.texts_per_request} {result.summary()}")


if __name__ == "__main__":
    main()
