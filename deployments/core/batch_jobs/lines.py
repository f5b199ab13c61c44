"""The lines of a Batch API job: an input file's requests in, answered and failed lines out.

Input lines are OpenAI's `{"custom_id", "method", "url", "body"}`; output and error lines
are `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`.
A line that cannot be read fails alone: it becomes an error line, the batch goes on.
Pure: no Ray, no HTTP.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import orjson


@dataclass(frozen=True)
class BatchLine:
    number: int  # among the file's non-blank lines, from 0
    custom_id: str
    body: bytes  # the request's JSON body, as the route would read it


@dataclass(frozen=True)
class LineFailure:
    number: int
    custom_id: str | None
    code: str
    message: str


def request_lines(data: bytes) -> list[bytes]:
    """The non-blank lines of a JSONL file; their positions are the lines' numbers."""
    return [line for line in data.split(b"\n") if line.strip()]


def read_lines(lines: Iterable[bytes], endpoint: str) -> Iterator[BatchLine | LineFailure]:
    """Each line as a request for `endpoint`, or why it is not one. A custom_id seen
    before fails its later lines, so every custom_id is answered once."""
    seen: set[str] = set()
    for number, raw in enumerate(lines):
        line = _read_line(number, raw, endpoint)
        if isinstance(line, BatchLine):
            if line.custom_id in seen:
                line = LineFailure(
                    number,
                    line.custom_id,
                    "duplicate_custom_id",
                    f"custom_id {line.custom_id!r} is used by an earlier line.",
                )
            else:
                seen.add(line.custom_id)
        yield line


def _read_line(number: int, raw: bytes, endpoint: str) -> BatchLine | LineFailure:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return LineFailure(number, None, "invalid_json_line", "The line is not valid JSON.")
    if not isinstance(value, dict):
        return LineFailure(number, None, "invalid_json_line", "The line is not a JSON object.")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineFailure(
            number, None, "missing_custom_id", "The line has no custom_id (a non-empty string)."
        )
    if value.get("method", "POST") != "POST":
        return LineFailure(number, custom_id, "invalid_method", "The line's method must be POST.")
    if value.get("url") != endpoint:
        return LineFailure(
            number,
            custom_id,
            "mismatched_url",
            f"The line's url must be the batch's endpoint, {endpoint}.",
        )
    body = value.get("body")
    if not isinstance(body, dict):
        return LineFailure(number, custom_id, "missing_body", "The line's body must be an object.")
    if body.get("stream"):
        return LineFailure(
            number, custom_id, "invalid_body", "A batch line cannot stream (stream: true)."
        )
    return BatchLine(number, custom_id, orjson.dumps(body))


def line_id(batch_id: str, number: int) -> str:
    # Derived, not random: a line answered again after a crash keeps its id.
    return f"batch_req_{batch_id.removeprefix('batch_')}_{number}"


def answered_line(
    batch_id: str, number: int, custom_id: str, status: int, request_id: str, body: bytes
) -> bytes:
    """The line of a request the server answered, 2xx (output file) or not (error file);
    `body` is the answer's JSON as sent."""
    return orjson.dumps(
        {
            "id": line_id(batch_id, number),
            "custom_id": custom_id,
            "response": {
                "status_code": status,
                "request_id": request_id,
                "body": orjson.Fragment(body),
            },
            "error": None,
        }
    )


def failed_line(
    batch_id: str, number: int, custom_id: str | None, code: str, message: str
) -> bytes:
    """The line of a request that was never answered (unreadable, expired, cancelled)."""
    return orjson.dumps(
        {
            "id": line_id(batch_id, number),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )
