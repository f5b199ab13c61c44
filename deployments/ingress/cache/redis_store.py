"""The result cache's shared backend: one Redis for every ingress replica and node.

Binary values (the packed entries as they are), one MGET per request's lookup and one
MSET (with a TTL: a pipeline of SETs with PX) per request's new entries, written after the
answer has gone. Every call has a hard deadline; a fault opens a short breaker during which
calls fail at once, so a dead Redis costs a request nothing but its cache, not a connect
timeout each time. The caller (`core/cache/model_cache.py`) counts every failure and serves the
request without the cache.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

KEY_PREFIX = "tributary:cache:"
# After a fault, how long calls fail fast before Redis is tried again.
BREAKER_S = 1.0


class StoreUnavailable(Exception):
    """Redis failed within the last BREAKER_S seconds; not tried again yet."""


class RedisStore:
    # The MSET is a second round trip; the ingress answers first (core/cache/model_cache.py).
    writes_behind = True

    def __init__(
        self,
        url: str,
        ttl_s: float | None,
        timeout_s: float,
        prefix: str = KEY_PREFIX,
    ) -> None:
        self._client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            # No retries: a retry multiplies the delay a request pays for a sick Redis.
            retry=Retry(NoBackoff(), 0),
        )
        self._ttl_ms = None if ttl_s is None else max(1, int(ttl_s * 1000))
        self._timeout_s = timeout_s
        self._prefix = prefix
        self._open_until = 0.0
        self.faults = 0

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        names = [self._prefix + key for key in keys]
        values = await self._call(self._client.mget(names))
        return list(values)

    async def put_many(self, entries: Sequence[tuple[str, bytes]]) -> None:
        if self._ttl_ms is None:
            # One command: a pipeline of SETs costs the client ~70 µs a key to build.
            await self._call(self._client.mset({self._prefix + k: v for k, v in entries}))
            return
        pipe = self._client.pipeline(transaction=False)
        for key, value in entries:
            pipe.set(self._prefix + key, value, px=self._ttl_ms)
        await self._call(pipe.execute())

    async def _call(self, operation: Awaitable[Any]) -> Any:
        if time.monotonic() < self._open_until:
            _close_unawaited(operation)
            raise StoreUnavailable("redis failed less than a second ago")
        try:
            # The client's own timeouts cover the socket; this covers everything else.
            result = await asyncio.wait_for(operation, self._timeout_s * 2)
        except Exception as exc:
            self.faults += 1
            self._open_until = time.monotonic() + BREAKER_S
            if isinstance(exc, RedisConnectionError | ConnectionError):
                # Every idle pooled socket may be as dead as this one (a restarted Redis):
                # drop them now. Kept, each would fail one call of its own later and open
                # the breaker again; a soak saw the cache back only 30 s after a restart.
                # Not on a timeout (a busy Redis, a busy machine: the sockets are fine), and
                # not the sockets in use, whose calls would fail for nothing.
                await self._client.connection_pool.disconnect(inuse_connections=False)
            raise
        return result

    def usage(self) -> dict[str, int]:
        # Bytes and evictions are the Redis server's (INFO memory, maxmemory-policy).
        return {"store_faults": self.faults}

    async def close(self) -> None:
        await self._client.aclose()


def _close_unawaited(operation: object) -> None:
    close = getattr(operation, "close", None)
    if close is not None:
        close()  # a coroutine never awaited would warn
