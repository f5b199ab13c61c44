"""The shared batch store for a Ray cluster: state in Redis, files on a path every node
reaches. Every ingress replica on every node dispatches from it; a lease in Redis says
which one runs a batch. The steps that must not interleave (a status change, a claim, a
line's answer and its count) are one Lua script each, hence atomic in Redis.

Durable as far as the Redis server is: run it with appendonly yes (docs/operations.md).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from deployments.core.batch_jobs.records import OPEN_STATUSES, BatchRecord, FileRecord
from deployments.ingress.batches.store import FileArea

PREFIX = "tributary:batches:"
PAGE = 500
# Without a bound, a call to a server that stopped answering (or to a port that is no
# longer Redis) waits forever and so does the batch's dispatcher. With one, the call fails
# and the dispatcher's next pass tries again. Generous: a batch store call is not hot.
SOCKET_TIMEOUT_S = 5.0

# KEYS: batch hash, global open set, tenant open set. ARGV: new status, record, batch id,
# 1 if the new status ends the batch, then the expected statuses. The record goes only
# where the stored status is expected.
SAVE = """
local status = redis.call('HGET', KEYS[1], 'status')
for i = 5, #ARGV do
  if ARGV[i] == status then
    redis.call('HSET', KEYS[1], 'status', ARGV[1], 'record', ARGV[2])
    if ARGV[4] == '1' then
      redis.call('SREM', KEYS[2], ARGV[3])
      redis.call('SREM', KEYS[3], ARGV[3])
    end
    return 1
  end
end
return 0
"""
# KEYS: batch hash. ARGV: owner, now, lease end. Takes the batch if its lease ran out.
CLAIM = """
if tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0') >= tonumber(ARGV[2]) then
  return nil
end
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease_until', ARGV[3])
return redis.call('HGET', KEYS[1], 'record')
"""
# KEYS: batch hash. ARGV: owner, lease end (0: release).
RENEW = """
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'lease_until', ARGV[2])
return 1
"""
# KEYS: results hash, counts hash. ARGV: line number, ok (1/0), line.
RECORD = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2] .. ARGV[3]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
return 1
"""


class RedisBatchStore:
    def __init__(self, url: str, root: Path) -> None:
        self.files = FileArea(root)
        self._redis = aioredis.Redis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S
        )
        self._save = self._redis.register_script(SAVE)
        self._claim = self._redis.register_script(CLAIM)
        self._renew = self._redis.register_script(RENEW)
        self._record = self._redis.register_script(RECORD)

    @staticmethod
    def _key(*parts: str) -> str:
        return PREFIX + ":".join(parts)

    async def put_file(self, record: FileRecord) -> None:
        await self._redis.set(self._key("file", record.id), record.to_json())

    async def get_file(self, file_id: str) -> FileRecord | None:
        data = await self._redis.get(self._key("file", file_id))
        return None if data is None else FileRecord.from_json(data)

    async def delete_file(self, file_id: str) -> bool:
        return bool(await self._redis.delete(self._key("file", file_id)))

    async def create_batch(self, record: BatchRecord) -> None:
        seq = await self._redis.incr(self._key("seq"))
        pipe = self._redis.pipeline(transaction=True)
        pipe.hset(
            self._key("batch", record.id),
            mapping={"status": record.status, "record": record.to_json(), "lease_until": 0},
        )
        pipe.zadd(self._key("tenant", record.tenant), {record.id: seq})
        pipe.sadd(self._key("open"), record.id)
        pipe.sadd(self._key("open", record.tenant), record.id)
        await pipe.execute()

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        data = await self._redis.hget(self._key("batch", batch_id), "record")
        return None if data is None else await self._counted(BatchRecord.from_json(data))

    async def _counted(self, record: BatchRecord) -> BatchRecord:
        if record.is_open:
            counts = await self._redis.hgetall(self._key("counts", record.id))
            record.completed = int(counts.get(b"1", 0))
            record.failed = int(counts.get(b"0", 0))
        return record

    async def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        key = self._key("tenant", tenant)
        below: Any = "+inf"
        if after is not None:
            score = await self._redis.zscore(key, after)
            if score is not None:
                below = f"({int(score)}"
        ids = await self._redis.zrevrangebyscore(key, below, "-inf", start=0, num=limit)
        found = [await self.get_batch(_text(i)) for i in ids]
        return [r for r in found if r is not None]

    async def open_batches(self, tenant: str) -> int:
        return int(await self._redis.scard(self._key("open", tenant)))

    async def save(self, record: BatchRecord, expect: Iterable[str]) -> bool:
        keys = [self._key("batch", record.id), self._key("open"), self._key("open", record.tenant)]
        ends = "0" if record.is_open else "1"
        args: list[str | bytes] = [record.status, record.to_json(), record.id, ends, *expect]
        return bool(await self._save(keys=keys, args=args))

    async def claim(self, owner: str, lease_s: float) -> BatchRecord | None:
        now = time.time()
        open_ids = sorted(await self._redis.smembers(self._key("open")))
        for raw in open_ids:
            data = await self._claim(
                keys=[self._key("batch", _text(raw))], args=[owner, now, now + lease_s]
            )
            if data is not None:
                record = BatchRecord.from_json(data)
                if record.status in OPEN_STATUSES:
                    return await self._counted(record)
        return None

    async def renew(self, batch_id: str, owner: str, lease_s: float) -> bool:
        lease_until = time.time() + lease_s
        return bool(
            await self._renew(keys=[self._key("batch", batch_id)], args=[owner, lease_until])
        )

    async def release(self, batch_id: str, owner: str) -> None:
        await self._renew(keys=[self._key("batch", batch_id)], args=[owner, 0])

    async def record(self, batch_id: str, number: int, ok: bool, line: bytes) -> bool:
        keys = [self._key("results", batch_id), self._key("counts", batch_id)]
        return bool(await self._record(keys=keys, args=[number, int(ok), line]))

    async def answered(self, batch_id: str) -> set[int]:
        return {int(k) for k in await self._redis.hkeys(self._key("results", batch_id))}

    async def results(self, batch_id: str) -> AsyncIterator[tuple[int, bool, bytes]]:
        key = self._key("results", batch_id)
        numbers = sorted(await self.answered(batch_id))
        for start in range(0, len(numbers), PAGE):
            page = numbers[start : start + PAGE]
            values = await self._redis.hmget(key, [str(n) for n in page])
            for number, value in zip(page, values, strict=True):
                raw = value if isinstance(value, bytes) else str(value).encode()
                yield number, raw[:1] == b"1", raw[1:]

    async def close(self) -> None:
        await self._redis.aclose()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
