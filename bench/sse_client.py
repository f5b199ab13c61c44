"""A streaming completion over raw asyncio HTTP/1.1, timed at the client: when the first
token's event arrives (TTFT), every later event, and `data: [DONE]`.

Like bench/loadgen.py it avoids a general-purpose HTTP client, whose CPU would come out of
the two cores the server under test runs on. The body is read as it arrives (chunked or
until the connection closes) and split into server-sent events; each event's `data:` is
classified without a full parse where possible.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import orjson

from bench.llm_workload import StreamTiming

DONE = b"[DONE]"


class SseSplitter:
    """Bytes in, complete events' `data:` payloads out; an event may span reads."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data.replace(b"\r\n", b"\n")
        *events, self._buffer = self._buffer.split(b"\n\n")
        out = []
        for event in events:
            lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line[:5] == b"data:"]
            if lines:
                out.append(b"\n".join(lines))
        return out


@dataclass(frozen=True)
class Event:
    has_choice: bool  # a token-bearing chunk (or the last one, with finish_reason)
    completion_tokens: int | None  # from the usage chunk
    done: bool


def classify(payload: bytes) -> Event:
    if payload == DONE:
        return Event(False, None, True)
    body = orjson.loads(payload)
    if "error" in body:
        raise RuntimeError(f"error event: {payload[:300]!r}")
    usage = body.get("usage")
    tokens = int(usage["completion_tokens"]) if usage else None
    return Event(bool(body.get("choices")), tokens, False)


def completion_request(host: str, port: int, body: dict) -> bytes:
    payload = orjson.dumps(body)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\nAccept: text/event-stream\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + payload


async def _body_pieces(reader: asyncio.StreamReader, head: bytes):  # type: ignore[no-untyped-def]
    if b"transfer-encoding: chunked" in head:
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                return
            yield (await reader.readexactly(size + 2))[:-2]
    else:
        while piece := await reader.read(65536):
            yield piece


async def stream_completion(
    host: str, port: int, request: bytes, started: float, timeout_s: float = 300.0
) -> StreamTiming:
    """Sends `request` (one streaming completion, `completion_request`) and times it from
    `started` (a `time.perf_counter()` value: when the request was due)."""
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request)
            head = (await reader.readuntil(b"\r\n\r\n")).lower()
            timing = StreamTiming(status=int(head[9:12]))
            if timing.status != 200:
                return timing
            splitter = SseSplitter()
            async for piece in _body_pieces(reader, head):
                now = time.perf_counter() - started
                for payload in splitter.feed(piece):
                    event = classify(payload)
                    if event.has_choice:
                        if not timing.chunk_times_s:
                            timing.ttft_s = now
                        timing.chunk_times_s.append(now)
                    if event.completion_tokens is not None:
                        timing.completion_tokens = event.completion_tokens
                    if event.done:
                        timing.e2e_s = now
                        return timing
            return timing  # ended without [DONE]: not ok
    except (OSError, EOFError, asyncio.IncompleteReadError, ValueError, RuntimeError):
        return StreamTiming(status=0)
    finally:
        if writer is not None:
            writer.close()
