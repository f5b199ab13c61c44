"""Schema fuzzing of the live default app (issue 12): every route of /openapi.json, real
model names, positive and negative inputs. 0 answers >= 500, 0 hangs, every error in the
documented shape. A few hundred requests in `make test`, >= 10,000 in `make reliability`."""

from __future__ import annotations

import time

import httpx
import pytest

from bench.server import Server
from tests.reliability import report
from tests.reliability.conftest import wait_for_generation
from tests.reliability.fuzzing import FuzzRun, fuzz
from tests.reliability.openapi_refs import dangling_refs
from tests.reliability.settings import sizes
from tests.reliability.shapes import histogram

pytestmark = pytest.mark.reliability

TOTAL = sizes().fuzz_requests
NEED_AN_OBJECT = frozenset(
    {
        "GET /v1/files/{file_id}",
        "GET /v1/files/{file_id}/content",
        "DELETE /v1/files/{file_id}",
        "POST /v1/batches",
        "GET /v1/batches/{batch_id}",
        "POST /v1/batches/{batch_id}/cancel",
    }
)


def test_openapi_document_has_no_dangling_refs(server: Server) -> None:
    document = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
    dangling = dangling_refs(document)
    report.record("openapi", {"dangling_refs": dangling})
    assert not dangling, f"/openapi.json has $refs that point nowhere: {dangling}"


@pytest.mark.timeout(max(600, TOTAL * 2))
def test_fuzzed_requests_never_get_a_5xx_or_hang(
    server: Server, models: dict[str, list[str]]
) -> None:
    wait_for_generation(server, models["generation"][0])
    run = FuzzRun(server.url, models)
    started = time.monotonic()
    fuzz(run, TOTAL)
    seconds = time.monotonic() - started
    statuses = histogram(run.statuses)
    report.record(
        "schema_fuzz",
        {
            "requests_sent": run.sent,
            "answered": len(run.statuses),
            "status_histogram": statuses,
            "by_operation": run.by_operation,
            "seconds": round(seconds, 1),
            "unusable_operations": run.unusable_operations,
            "failures": run.failures,
        },
    )
    assert run.sent >= TOTAL, f"only {run.sent} of {TOTAL} requests were generated"
    assert not run.unusable_operations, (
        f"/openapi.json leaves operations unusable: {run.unusable_operations}"
    )
    # Bodies the fuzzer built from the schema must reach the models, not only be refused.
    # Not the Batch API's operations on an object that must exist first (a file or batch id
    # the fuzzer cannot know): their answers are still checked for 5xx and shape above.
    unreached = [
        op
        for op, counts in run.by_operation.items()
        if "200" not in counts and op not in NEED_AN_OBJECT
    ]
    assert not unreached, f"no generated request was accepted by: {unreached}"
    assert not run.failures, f"{len(run.failures)} failures, first: {run.failures[:5]}"
