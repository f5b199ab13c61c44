"""The documented error shape, `{"error": {"message", "type", "param", "code"}}`, checked
on any response body."""

from __future__ import annotations

from typing import Any

import orjson

ERROR_KEYS = {"message", "type", "param", "code"}


def error_shape_problem(body: bytes) -> str | None:
    """None when `body` is an error in the documented shape, else what is wrong with it."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"not JSON: {body[:120]!r}"
    if not isinstance(parsed, dict) or set(parsed) != {"error"}:
        return f"not an object with one 'error' key: {body[:120]!r}"
    error = parsed["error"]
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        return f"'error' does not have exactly {sorted(ERROR_KEYS)}: {body[:120]!r}"
    if not isinstance(error["message"], str) or not error["message"]:
        return "'message' is not a non-empty string"
    if not isinstance(error["type"], str):
        return "'type' is not a string"
    for key in ("param", "code"):
        if error[key] is not None and not isinstance(error[key], str):
            return f"'{key}' is neither a string nor null"
    return None


def histogram(statuses: list[int]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for status in sorted(statuses):
        counts[str(status)] = counts.get(str(status), 0) + 1
    return counts
