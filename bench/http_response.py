"""Reading HTTP/1.1 responses off raw asyncio streams, just enough for the load generators:
the status, where the body ends, keep-alive and Retry-After. Shared by `loadgen`,
`open_loop` and the hostile-input tests."""

import asyncio
import email.utils
import math
import time
from typing import NamedTuple

_NO_BODY_STATUSES = frozenset({*range(100, 200), 204, 304})
# Statuses after which a client that honours Retry-After waits before its next request.
RETRY_STATUSES = frozenset({429, 503})


def _header(head_lower: bytes, name: bytes) -> bytes | None:
    start = head_lower.find(b"\r\n" + name + b":")
    if start < 0:
        return None
    start += len(name) + 3
    return head_lower[start : head_lower.index(b"\r\n", start)].strip()


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size_line = await reader.readuntil(b"\r\n")
        size = int(size_line.split(b";", 1)[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                pass
            return b"".join(parts)
        parts.append((await reader.readexactly(size + 2))[:-2])


def parse_retry_after(value: bytes | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After value (delta-seconds or an HTTP date, RFC 9110);
    None when absent or unreadable. ``now`` is the Unix time an HTTP date is measured from."""
    if value is None:
        return None
    text = value.decode("latin-1").strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    return max(0.0, seconds) if math.isfinite(seconds) else None


class Answer(NamedTuple):
    status: int
    body: bytes
    keep_alive: bool
    retry_after: bytes | None  # the Retry-After value as sent
    retry_after_ms: bytes | None  # the `retry-after-ms` value as sent

    def wait_s(self) -> float | None:
        """How long a client should wait before asking again, read as the OpenAI SDK reads
        it: `retry-after-ms` first, then Retry-After; None when neither is readable."""
        if self.retry_after_ms is not None:
            ms = parse_retry_after(self.retry_after_ms)
            if ms is not None:
                return ms / 1000
        return parse_retry_after(self.retry_after)


async def read_response(reader: asyncio.StreamReader) -> Answer:
    """One response, read just far enough to know where its body ends."""
    head = (await reader.readuntil(b"\r\n\r\n")).lower()
    status = int(head[9:12])
    connection = _header(head, b"connection")
    keep_alive = (
        connection != b"close" if head.startswith(b"http/1.1") else connection == b"keep-alive"
    )
    length = _header(head, b"content-length")
    encoding = _header(head, b"transfer-encoding")
    if status in _NO_BODY_STATUSES:
        body = b""
    elif length is not None:
        body = await reader.readexactly(int(length))
    elif encoding is not None and b"chunked" in encoding:
        body = await _read_chunked(reader)
    else:
        body = await reader.read()  # delimited by connection close
        keep_alive = False
    retry_after = _header(head, b"retry-after")
    return Answer(status, body, keep_alive, retry_after, _header(head, b"retry-after-ms"))
