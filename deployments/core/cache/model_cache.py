"""One model's result cache at the ingress: look items up, compute each missing one once
(in-flight de-duplication across concurrent requests and within one), store what was
computed. A store fault is counted and the request is served without the cache: the cache
may make a request faster, never make it fail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from deployments.core.cache.result_cache import CacheCounts, CacheStore, InFlight, OwnerGone

logger = logging.getLogger(__name__)

# key list -> {key: packed entry} for every key given; raises if the items failed.
Compute = Callable[[list[str]], Awaitable[dict[str, bytes]]]


# Writes a store may have pending behind the answers before a request waits for its own.
MAX_PENDING_WRITES = 64

# Every stored value starts with the first bytes of its own key: a reply that a store
# (a Redis connection after a timeout, say) hands back for another key is caught.
TAG_BYTES = 8


def _tag(key: str) -> bytes:
    return key.encode()[:TAG_BYTES].ljust(TAG_BYTES, b"\0")


class CacheObserver(Protocol):
    """Where one model's cache reports, for the metrics."""

    def lookups(self, hits: int, misses: int) -> None: ...

    def stored(self, used_bytes: int, new_evictions: int) -> None: ...

    def fault(self, operation: str) -> None: ...


class ModelCache:
    def __init__(self, model: str, store: CacheStore, observer: CacheObserver | None = None):
        self.model = model
        self.store = store
        self.counts = CacheCounts()
        # One table per lane (priority class): a realtime request must not wait behind a
        # batch-class request's queue for the same text, so duplicates across classes are
        # computed once per class, within a class once.
        self._lanes: dict[str, InFlight] = {}
        self._observer = observer
        self._evictions_seen = 0
        # Entries computed here whose write to a store that writes behind has not finished:
        # read from here meanwhile, so an answer is never followed by a miss on its texts.
        self._writing: dict[str, bytes] = {}
        self._writes: set[asyncio.Task[None]] = set()

    async def resolve(
        self, keys: Sequence[str], compute: Compute, lane: str = ""
    ) -> tuple[dict[str, bytes], int]:
        """Every key's entry, and how many of `keys` (positions, duplicates included) hit."""
        found, hits = await self.lookup(keys)
        missing = [key for key in dict.fromkeys(keys) if key not in found]
        if missing:
            inflight = self._lanes.setdefault(lane, InFlight())
            found.update(await self._fill(missing, compute, inflight))
        return found, hits

    async def lookup(self, keys: Sequence[str]) -> tuple[dict[str, bytes], int]:
        """The entries found, counted as hits and misses; no computation. For a caller
        that computes its misses itself and `keep`s them (a streamed completion)."""
        found = await self._lookup(keys)
        hits = sum(1 for key in keys if key in found)
        self.counts.hits += hits
        self.counts.misses += len(keys) - hits
        if self._observer is not None:
            self._observer.lookups(hits, len(keys) - hits)
        return found, hits

    async def _fill(
        self, missing: list[str], compute: Compute, inflight: InFlight
    ) -> dict[str, bytes]:
        owned, waits = inflight.claim(missing)
        self.counts.deduplicated += len(waits)
        values: dict[str, bytes] = {}
        if owned:
            try:
                computed = await compute(owned)
            except BaseException as exc:
                # Waiters get the failure; a cancelled owner lets them compute instead.
                error = OwnerGone() if isinstance(exc, asyncio.CancelledError) else exc
                for key in owned:
                    inflight.fail(key, error)
                raise
            for key in owned:
                inflight.resolve(key, computed[key])
            values.update(computed)
            await self.keep([(key, computed[key]) for key in owned])
        orphaned: list[str] = []
        for key, future in waits.items():
            try:
                # shield: this request leaving must not cancel the owner's shared future.
                values[key] = await asyncio.shield(future)
            except OwnerGone:
                orphaned.append(key)
        if orphaned:
            values.update(await self._fill(orphaned, compute, inflight))
        return values

    async def _lookup(self, keys: Sequence[str]) -> dict[str, bytes]:
        found = {key: self._writing[key] for key in keys if key in self._writing}
        distinct = [key for key in dict.fromkeys(keys) if key not in found]
        if not distinct:
            return found
        try:
            values = await self.store.get_many(distinct)
            if len(values) != len(distinct):
                raise ValueError(f"{len(values)} values for {len(distinct)} keys")
        except Exception as exc:
            self._fault("read", exc)
            return found
        for key, value in zip(distinct, values, strict=True):
            if value is None:
                continue
            if value[:TAG_BYTES] != _tag(key):
                # Another key's value (a cross-wired reply): a miss, never a wrong answer.
                self._fault("read", ValueError("an entry under the wrong key"))
                continue
            found[key] = value[TAG_BYTES:]
        return found

    async def keep(self, entries: Sequence[tuple[str, bytes]]) -> None:
        """Store now, or, for a store that writes behind, after the answer: the write
        runs as a task (waited for only while MAX_PENDING_WRITES are already running).
        A fault is counted, never raised."""
        if not self.store.writes_behind or len(self._writes) >= MAX_PENDING_WRITES:
            await self._store(entries)
            return
        for key, value in entries:
            self._writing[key] = value
        task = asyncio.create_task(self._store_behind(entries))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _store_behind(self, entries: Sequence[tuple[str, bytes]]) -> None:
        try:
            await self._store(entries)
        finally:
            for key, value in entries:
                if self._writing.get(key) is value:
                    del self._writing[key]

    async def flush(self) -> None:
        """Wait for the writes behind (tests and benchmarks; the ingress never waits: a
        write lost at shutdown costs a later miss, nothing more)."""
        while self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)

    async def _store(self, entries: Sequence[tuple[str, bytes]]) -> None:
        try:
            await self.store.put_many([(key, _tag(key) + value) for key, value in entries])
        except Exception as exc:
            self._fault("write", exc)
            return
        usage = self.store.usage()
        if self._observer is not None and "bytes" in usage:
            evictions = usage.get("evictions", 0)
            self._observer.stored(usage["bytes"], evictions - self._evictions_seen)
            self._evictions_seen = evictions

    def _fault(self, what: str, exc: Exception) -> None:
        self.counts.errors += 1
        if self._observer is not None:
            self._observer.fault(what)
        # Once per fault kind would hide recovery; the count is the signal, the log the why.
        logger.warning("result cache %s for model %r failed: %r", what, self.model, exc)

    def in_flight(self) -> int:
        return sum(len(lane) for lane in self._lanes.values())

    def stats(self) -> dict[str, int]:
        counts = self.counts
        return {
            "hits": counts.hits,
            "misses": counts.misses,
            "deduplicated": counts.deduplicated,
            "errors": counts.errors,
            "in_flight": self.in_flight(),
            **self.store.usage(),
        }
