"""A finished batch's output and error files, written from the answers its store kept.

The files' ids come from the batch's, so finalizing again after a crash rewrites the same
two files instead of leaving orphans, and each kept answer appears in exactly one of them.
"""

from __future__ import annotations

import time

from deployments.core.batch_jobs.records import BatchRecord, FileRecord
from deployments.ingress.batches.store import BatchStore


def output_file_id(batch_id: str, kind: str) -> str:
    return f"file-{batch_id.removeprefix('batch_')}-{kind}"


async def write_results(
    store: BatchStore, record: BatchRecord
) -> tuple[str | None, str | None, int, int]:
    """Writes the output (2xx answers) and error files in line order; their ids (None for
    an empty one, as OpenAI) and the counts of lines in each."""
    area = store.files
    outputs, errors = area.writer(), area.writer()
    counts = {True: 0, False: 0}
    try:
        async for _, ok, line in store.results(record.id):
            (outputs if ok else errors).write(line + b"\n")
            counts[ok] += 1
    finally:
        outputs.close()
        errors.close()
    ids: list[str | None] = []
    for kind, handle, count in (
        ("output", outputs, counts[True]),
        ("error", errors, counts[False]),
    ):
        if count == 0:
            area.discard(handle.name)
            ids.append(None)
            continue
        file_id = output_file_id(record.id, kind)
        area.commit(handle.name, file_id)
        await store.put_file(
            FileRecord(
                id=file_id,
                tenant=record.tenant,
                filename=f"{record.id}_{kind}.jsonl",
                purpose="batch_output",
                size=area.path(file_id).stat().st_size,
                created_at=int(time.time()),
                lines=count,
            )
        )
        ids.append(file_id)
    return ids[0], ids[1], counts[True], counts[False]
