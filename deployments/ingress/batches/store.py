"""The interface every batch store keeps, and the directory its files live in.

A store holds the file and batch records, the leases by which one dispatcher at a time
runs a batch, and each line's answer. `record` is the exactly-once point: a line's answer
is written once (a second write of the same line is ignored), before the dispatcher counts
it done, so a line answered before a crash is never run again and never appears twice.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Protocol

from deployments.core.batch_jobs.records import BatchRecord, FileRecord


class BatchStore(Protocol):
    files: FileArea

    async def put_file(self, record: FileRecord) -> None: ...

    async def get_file(self, file_id: str) -> FileRecord | None: ...

    async def delete_file(self, file_id: str) -> bool: ...

    async def create_batch(self, record: BatchRecord) -> None: ...

    async def get_batch(self, batch_id: str) -> BatchRecord | None:
        """The record with its `completed` and `failed` counts as recorded so far."""
        ...

    async def list_batches(self, tenant: str, after: str | None, limit: int) -> list[BatchRecord]:
        """The tenant's batches, newest first, those after the batch `after` only."""
        ...

    async def open_batches(self, tenant: str) -> int: ...

    async def save(self, record: BatchRecord, expect: Iterable[str]) -> bool:
        """Writes the record if its stored status is one of `expect` (a status changed
        by someone else, a cancel, is never overwritten); whether it did."""
        ...

    async def claim(self, owner: str, lease_s: float) -> BatchRecord | None:
        """An open batch no live dispatcher holds, now leased to `owner`."""
        ...

    async def renew(self, batch_id: str, owner: str, lease_s: float) -> bool:
        """Extends `owner`'s lease; False when another dispatcher took the batch."""
        ...

    async def release(self, batch_id: str, owner: str) -> None: ...

    async def record(self, batch_id: str, number: int, ok: bool, line: bytes) -> bool:
        """Keeps line `number`'s answer unless one is kept already; whether this one was."""
        ...

    async def answered(self, batch_id: str) -> set[int]: ...

    def results(self, batch_id: str) -> AsyncIterator[tuple[int, bool, bytes]]:
        """Every kept answer in line order, read a page at a time."""
        ...

    async def close(self) -> None: ...


class FileArea:
    """Uploaded and produced files, one file each under `root/files/`; written whole to a
    temporary name and renamed, so a reader never sees half a file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / "files"
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, file_id: str) -> Path:
        return self.dir / file_id

    def writer(self) -> tempfile._TemporaryFileWrapper[bytes]:
        return tempfile.NamedTemporaryFile(dir=self.dir, prefix=".part-", delete=False)

    def commit(self, temporary: str, file_id: str) -> None:
        os.replace(temporary, self.path(file_id))

    def discard(self, temporary: str) -> None:
        os.unlink(temporary)

    def remove(self, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)
