"""Reading a batch's input lines and writing its answers (core/batch_jobs/lines.py), the pace
(core/batch_jobs/pacing.py) and the upload's checks (ingress/batches/upload.py)."""

from __future__ import annotations

import io

import orjson
import pytest

from deployments.batch_cli import progress_line
from deployments.config import BatchesConfig
from deployments.core.batch_jobs.lines import (
    BatchLine,
    LineFailure,
    answered_line,
    failed_line,
    read_lines,
    request_lines,
)
from deployments.core.batch_jobs.pacing import Pace
from deployments.errors import PayloadTooLarge
from deployments.ingress.batches.upload import copy_lines


def line(**fields: object) -> bytes:
    base = {"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}
    return orjson.dumps({**base, **fields})


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{nope", "invalid_json_line"),
        (b"[1]", "invalid_json_line"),
        (line(custom_id=""), "missing_custom_id"),
        (line(method="GET"), "invalid_method"),
        (line(url="/v1/completions"), "mismatched_url"),
        (line(body="x"), "missing_body"),
        (line(body={"input": "x", "stream": True}), "invalid_body"),
    ],
)
def test_a_malformed_line_fails_alone(raw: bytes, code: str) -> None:
    good, bad = list(read_lines([line(custom_id="ok"), raw], "/v1/embeddings"))
    assert isinstance(good, BatchLine) and good.custom_id == "ok"
    assert isinstance(bad, LineFailure) and bad.code == code and bad.number == 1


def test_a_repeated_custom_id_fails_its_later_lines() -> None:
    lines = list(read_lines([line(), line(), line(custom_id="b")], "/v1/embeddings"))
    assert [type(x).__name__ for x in lines] == ["BatchLine", "LineFailure", "BatchLine"]


def test_blank_lines_are_not_requests() -> None:
    assert request_lines(b"a\n\n  \nb\n") == [b"a", b"b"]


def test_answer_lines_have_openai_shape() -> None:
    ok = orjson.loads(answered_line("batch_x", 3, "c", 200, "r", b'{"data": []}'))
    assert ok == {
        "id": "batch_req_x_3",
        "custom_id": "c",
        "response": {"status_code": 200, "request_id": "r", "body": {"data": []}},
        "error": None,
    }
    failed = orjson.loads(failed_line("batch_x", 4, None, "batch_expired", "late"))
    assert failed["response"] is None and failed["error"]["code"] == "batch_expired"


def test_the_pace_halves_on_refusal_and_grows_back() -> None:
    pace = Pace(8)
    assert pace.may_start(7, 0.0, "idle")
    assert not pace.may_start(8, 0.0, "idle")
    assert not pace.may_start(0, 0.0, "queued")
    pace.refused(0.0, 1.0)
    assert pace.window == 4 and not pace.may_start(0, 0.5, "idle")
    assert pace.may_start(3, 1.0, "idle")
    for _ in range(4):
        pace.succeeded()
    assert pace.window == 5


def test_beside_running_higher_classes_a_few_lines_run_a_while() -> None:
    pace = Pace(512)
    assert pace.may_start(7, 0.0, "active") and not pace.may_start(8, 0.0, "active")
    assert not pace.may_start(8, 0.4, "idle")  # the share holds a moment after
    assert pace.may_start(8, 0.6, "idle")


def test_the_upload_counts_lines_and_refuses_a_long_one() -> None:
    config = BatchesConfig(max_line_bytes=256)
    sink = io.BytesIO()
    assert copy_lines(io.BytesIO(b"a\n\nb\nc"), sink, config) == (6, 3)
    with pytest.raises(PayloadTooLarge) as raised:
        copy_lines(io.BytesIO(b"a\n" + b"x" * 300 + b"\n"), io.BytesIO(), config)
    assert raised.value.code == "line_too_large" and "line 2" in raised.value.message


def test_the_cli_progress_line() -> None:
    batch = {"status": "in_progress", "request_counts": {"total": 10, "completed": 4, "failed": 1}}
    line = progress_line(batch, started=0.0, now=5.0)
    assert line.startswith("[" + "#" * 15 + "." * 15 + "] 5/10 lines (1 failed)")
    assert line.endswith("in_progress  1 lines/s")
