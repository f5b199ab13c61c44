"""The embedded batch store for one node: SQLite beside the files, no server to run.

WAL with synchronous=NORMAL: a commit survives the process dying (the app restarting, a
replica killed), which is what a batch must outlive; several ingress replicas of the node
share the database file. Calls run on a worker thread, so the event loop never waits on
the disk.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from deployments.core.batch_jobs.records import OPEN_STATUSES, BatchRecord, FileRecord
from deployments.ingress.batches.store import FileArea

T = TypeVar("T")
PAGE = 500

SCHEMA = """
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, tenant TEXT, record BLOB);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, tenant TEXT, status TEXT, created_at INTEGER, seq INTEGER,
    owner TEXT, lease_until REAL, record BLOB);
CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant, seq);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT, number INTEGER, ok INTEGER, line BLOB, PRIMARY KEY (batch_id, number));
"""


class SqliteStore:
    def __init__(self, root: Path) -> None:
        self.files = FileArea(root)
        self._db = sqlite3.connect(
            root / "batches.sqlite3", check_same_thread=False, isolation_level=None, timeout=30
        )
        self._lock = threading.Lock()
        self._waiting: list[tuple[str, int, bool, bytes, asyncio.Future[bool]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock:
                return work(self._db)

        return await asyncio.to_thread(locked)

    async def put_file(self, record: FileRecord) -> None:
        await self._run(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?)",
                (record.id, record.tenant, record.to_json()),
            )
        )

    async def get_file(self, file_id: str) -> FileRecord | None:
        row = await self._run(
            lambda db: db.execute("SELECT record FROM files WHERE id = ?", (file_id,)).fetchone()
        )
        return None if row is None else FileRecord.from_json(row[0])

    async def delete_file(self, file_id: str) -> bool:
        cursor = await self._run(
            lambda db: db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        )
        return cursor.rowcount > 0

    async def create_batch(self, record: BatchRecord) -> None:
        def insert(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT INTO batches VALUES (?, ?, ?, ?, "
                "(SELECT COALESCE(MAX(seq), 0) + 1 FROM batches), NULL, 0, ?)",
                (record.id, record.tenant, record.status, record.created_at, record.to_json()),
            )

        await self._run(insert)

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        def read(db: sqlite3.Connection) -> BatchRecord | None:
            row = db.execute("SELECT record FROM batches WHERE id = ?", (batch_id,)).fetchone()
            return None if row is None else _counted(db, BatchRecord.from_json(row[0]))

        return await self._run(read)

    async def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        def read(db: sqlite3.Connection) -> list[BatchRecord]:
            below = db.execute(
                "SELECT seq FROM batches WHERE id = ? AND tenant = ?", (after, tenant)
            ).fetchone()
            rows = db.execute(
                "SELECT record FROM batches WHERE tenant = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                (tenant, below[0] if below else 2**62, limit),
            ).fetchall()
            return [_counted(db, BatchRecord.from_json(r[0])) for r in rows]

        return await self._run(read)

    async def open_batches(self, tenant: str) -> int:
        marks = ",".join("?" * len(OPEN_STATUSES))
        row = await self._run(
            lambda db: db.execute(
                f"SELECT COUNT(*) FROM batches WHERE tenant = ? AND status IN ({marks})",
                (tenant, *OPEN_STATUSES),
            ).fetchone()
        )
        return int(row[0])

    async def save(self, record: BatchRecord, expect: Iterable[str]) -> bool:
        statuses = tuple(expect)
        marks = ",".join("?" * len(statuses))
        cursor = await self._run(
            lambda db: db.execute(
                f"UPDATE batches SET status = ?, record = ? WHERE id = ? AND status IN ({marks})",
                (record.status, record.to_json(), record.id, *statuses),
            )
        )
        return cursor.rowcount > 0

    async def claim(self, owner: str, lease_s: float) -> BatchRecord | None:
        marks = ",".join("?" * len(OPEN_STATUSES))

        def take(db: sqlite3.Connection) -> BatchRecord | None:
            now = time.time()
            # One statement: two dispatchers cannot both take the same batch.
            row = db.execute(
                f"UPDATE batches SET owner = ?, lease_until = ? WHERE id = ("
                f"SELECT id FROM batches WHERE status IN ({marks}) AND lease_until < ? "
                "ORDER BY seq LIMIT 1) RETURNING record",
                (owner, now + lease_s, *OPEN_STATUSES, now),
            ).fetchone()
            return None if row is None else _counted(db, BatchRecord.from_json(row[0]))

        return await self._run(take)

    async def renew(self, batch_id: str, owner: str, lease_s: float) -> bool:
        cursor = await self._run(
            lambda db: db.execute(
                "UPDATE batches SET lease_until = ? WHERE id = ? AND owner = ?",
                (time.time() + lease_s, batch_id, owner),
            )
        )
        return cursor.rowcount > 0

    async def release(self, batch_id: str, owner: str) -> None:
        await self._run(
            lambda db: db.execute(
                "UPDATE batches SET owner = NULL, lease_until = 0 WHERE id = ? AND owner = ?",
                (batch_id, owner),
            )
        )

    async def record(self, batch_id: str, number: int, ok: bool, line: bytes) -> bool:
        # Group commit: the answers that arrive while one transaction is being written go
        # in the next one, so many lines in flight cost one commit, not one each. A line's
        # call returns only once its transaction is committed.
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((batch_id, number, ok, line, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_waiting())
        return await done

    async def _write_waiting(self) -> None:
        while self._waiting:
            group, self._waiting = self._waiting, []

            def write(db: sqlite3.Connection) -> list[bool]:
                db.execute("BEGIN")
                try:
                    kept = [
                        db.execute(
                            "INSERT OR IGNORE INTO results VALUES (?, ?, ?, ?)",
                            (batch_id, number, int(ok), line),
                        ).rowcount
                        > 0
                        for batch_id, number, ok, line, _ in group  # noqa: B023
                    ]
                    db.execute("COMMIT")
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                return kept

            try:
                kept = await self._run(write)
            except Exception as exc:
                for *_, done in group:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for (*_, done), new in zip(group, kept, strict=True):
                if not done.done():
                    done.set_result(new)

    async def answered(self, batch_id: str) -> set[int]:
        rows = await self._run(
            lambda db: db.execute(
                "SELECT number FROM results WHERE batch_id = ?", (batch_id,)
            ).fetchall()
        )
        return {r[0] for r in rows}

    async def results(self, batch_id: str) -> AsyncIterator[tuple[int, bool, bytes]]:
        def page(since: int) -> Callable[[sqlite3.Connection], list[Any]]:
            return lambda db: db.execute(
                "SELECT number, ok, line FROM results WHERE batch_id = ? AND number > ? "
                "ORDER BY number LIMIT ?",
                (batch_id, since, PAGE),
            ).fetchall()

        last = -1
        while True:
            rows = await self._run(page(last))
            for number, ok, line in rows:
                yield number, bool(ok), bytes(line)
            if len(rows) < PAGE:
                return
            last = rows[-1][0]

    async def close(self) -> None:
        await self._run(lambda db: db.close())


def _counted(db: sqlite3.Connection, record: BatchRecord) -> BatchRecord:
    if record.is_open:  # a finished batch carries its final counts
        counts = dict(
            db.execute(
                "SELECT ok, COUNT(*) FROM results WHERE batch_id = ? GROUP BY ok", (record.id,)
            ).fetchall()
        )
        record.completed, record.failed = counts.get(1, 0), counts.get(0, 0)
    return record
