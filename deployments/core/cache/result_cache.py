"""The per-item result cache, as pure logic: keys, a byte-bounded LRU with optional TTL,
the store protocol a Redis backend also fills, and the in-flight table that makes identical
items in concurrent requests share one computation.

Values are opaque bytes (`core/cache/cache_entries.py` packs them), so an entry has one size to
bound and travels unchanged to Redis. Keys are sha256 hex digests of every part that can
change a result: the model's name, version and result-affecting settings, the request's
parameters, the scope (a tenant's name, or none), and the item's content. A new version
therefore never sees an old version's entries; nothing is ever invalidated in place.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# Every key part is length-prefixed before hashing, so ("ab", "c") and ("a", "bc") differ.
KeyPart = str | bytes | int | float | bool | None


def item_key(namespace: Sequence[KeyPart], content: bytes) -> str:
    digest = hashlib.sha256()
    for part in (*namespace, content):
        raw = part if isinstance(part, bytes) else repr(part).encode()
        digest.update(len(raw).to_bytes(8, "little"))
        digest.update(raw)
    return digest.hexdigest()


@dataclass
class CacheCounts:
    """What /v1/stats shows per model, and what the metrics mirror."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0
    errors: int = 0  # store faults (Redis down or slow): served without the cache
    deduplicated: int = 0  # misses that waited for an identical item in flight


class CacheStore(Protocol):
    """Where entries live. Batched both ways: one round trip per request, not per item.
    A store may raise on a fault; the caller serves the request without the cache.
    `writes_behind`: a write costs a round trip, so the answer should not wait for it."""

    writes_behind: bool

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]: ...

    async def put_many(self, entries: Sequence[tuple[str, bytes]]) -> None: ...

    def usage(self) -> dict[str, int]: ...


@dataclass
class _Entry:
    value: bytes
    expires: float  # monotonic seconds; inf without a TTL


# A dict entry's own overhead beyond key and value, so many tiny entries still respect the
# bound roughly (CPython: key str ~49 + 64 chars, bytes header 33, entry and node ~100).
ENTRY_OVERHEAD_BYTES = 200


@dataclass
class ByteLRU:
    """In-process LRU bounded by the bytes of its entries (keys, values and overhead);
    the least recently used entries go first. Single-threaded: one event loop owns it."""

    max_bytes: int
    ttl_s: float | None = None
    clock: Callable[[], float] = time.monotonic
    used_bytes: int = 0
    evictions: int = 0
    _entries: OrderedDict[str, _Entry] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: str, value: bytes) -> None:
        size = _size(key, value)
        if size > self.max_bytes:
            return  # one entry larger than the whole cache is not kept
        if key in self._entries:
            self._drop(key)
        expires = float("inf") if self.ttl_s is None else self.clock() + self.ttl_s
        self._entries[key] = _Entry(value, expires)
        self.used_bytes += size
        while self.used_bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)
            self.evictions += 1

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        self.used_bytes -= _size(key, entry.value)


def _size(key: str, value: bytes) -> int:
    return len(key) + len(value) + ENTRY_OVERHEAD_BYTES


class MemoryStore:
    """The embedded backend: a `ByteLRU` behind the store protocol."""

    writes_behind = False  # a write is a dict insert: cheaper than a task to defer it

    def __init__(self, max_bytes: int, ttl_s: float | None = None) -> None:
        self.lru = ByteLRU(max_bytes, ttl_s)

    async def get_many(self, keys: Sequence[str]) -> list[bytes | None]:
        return [self.lru.get(key) for key in keys]

    async def put_many(self, entries: Sequence[tuple[str, bytes]]) -> None:
        for key, value in entries:
            self.lru.put(key, value)

    def usage(self) -> dict[str, int]:
        return {
            "entries": len(self.lru),
            "bytes": self.lru.used_bytes,
            "max_bytes": self.lru.max_bytes,
            "evictions": self.lru.evictions,
        }


class OwnerGone(Exception):
    """The request computing an item went away (its client left) before it finished; a
    waiter computes the item itself rather than failing for someone else's disconnect."""


class InFlight:
    """Items being computed now, key -> the future their result will land in. The first
    request to miss on a key owns it; later ones await the owner's future. A failure
    reaches the waiters and is never stored."""

    def __init__(self) -> None:
        self._futures: dict[str, asyncio.Future[bytes]] = {}

    def __len__(self) -> int:
        return len(self._futures)

    def claim(self, keys: Sequence[str]) -> tuple[list[str], dict[str, asyncio.Future[bytes]]]:
        """Splits distinct keys into those this caller now owns and those already in
        flight (with the futures to await)."""
        owned: list[str] = []
        waits: dict[str, asyncio.Future[bytes]] = {}
        loop = asyncio.get_running_loop()
        for key in dict.fromkeys(keys):
            future = self._futures.get(key)
            if future is None:
                self._futures[key] = loop.create_future()
                owned.append(key)
            else:
                waits[key] = future
        return owned, waits

    def resolve(self, key: str, value: bytes) -> None:
        future = self._futures.pop(key, None)
        if future is not None and not future.done():
            future.set_result(value)

    def fail(self, key: str, error: BaseException) -> None:
        future = self._futures.pop(key, None)
        if future is not None and not future.done():
            future.set_exception(error)
            # Nobody may be waiting; asyncio would log "exception never retrieved".
            future.add_done_callback(_consume)


def _consume(future: asyncio.Future[bytes]) -> None:
    if not future.cancelled():
        future.exception()
