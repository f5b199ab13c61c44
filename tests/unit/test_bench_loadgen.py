"""The closed-loop load generator against a small asyncio server on a real socket: refusals
with a Retry-After are counted apart from errors, and its clients wait as they are told."""

import asyncio

from bench.loadgen import LoadResult, refused_share, run_closed_loop

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
REFUSED = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 2\r\n\r\n{}"
BROKEN = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 2\r\n\r\n{}"


async def _serve_in_turn(answers: list[bytes]) -> tuple[asyncio.Server, list[float]]:
    """Answers each request with the next of `answers` (the last one repeated), keeping
    when each request arrived."""
    arrivals: list[float] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the client closed its connection at the end of the run
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            arrivals.append(asyncio.get_running_loop().time())
            writer.write(answers[min(len(arrivals), len(answers)) - 1])
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, arrivals


async def _load(
    answers: list[bytes], honor: bool, duration_s: float = 1.5
) -> tuple[LoadResult, list[float]]:
    server, arrivals = await _serve_in_turn(answers)
    port = server.sockets[0].getsockname()[1]
    try:
        result = await run_closed_loop(
            "127.0.0.1",
            port,
            "/v1/embeddings",
            [b"{}"],
            1,
            1,
            duration_s,
            warmup_s=0,
            progress=False,
            honor_retry_after=honor,
        )
    finally:
        server.close()
    return result, arrivals


def test_a_refused_client_waits_its_retry_after_and_the_refusal_is_not_an_error() -> None:
    # A window well past the 1 s asked: a wait is cut short at the window's end.
    result, arrivals = asyncio.run(_load([REFUSED, OK], honor=True, duration_s=4.0))
    assert result.refused == 1 and result.failures == 1 and result.errors == 0
    assert result.requests >= 1
    assert arrivals[1] - arrivals[0] >= 0.95  # the second request came after Retry-After


def test_a_client_that_ignores_retry_after_asks_again_at_once() -> None:
    result, arrivals = asyncio.run(_load([REFUSED], honor=False, duration_s=0.5))
    assert result.refused == result.failures > 10
    assert arrivals[1] - arrivals[0] < 0.5


def test_an_error_without_retry_after_is_a_failure_not_a_refusal() -> None:
    result, _ = asyncio.run(_load([BROKEN], honor=True, duration_s=0.3))
    assert result.failures > 0 and result.refused == 0
    assert result.errors == result.failures


def test_the_refused_share_is_over_every_answer_of_every_run() -> None:
    def result(ok: int, failures: int, refused: int) -> LoadResult:
        return LoadResult(ok, failures, ok, 1.0, [], {}, None, refused=refused)

    assert refused_share([result(6, 4, 3), result(8, 2, 1)]) == 0.2
    assert refused_share([]) == 0.0
