"""What the headers of a request say about how to serve it: priority, deadline, id."""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from deployments.core.priority import Priority
from deployments.errors import InvalidRequest

PRIORITY_HEADER = "x-priority"
TIMEOUT_HEADER = "x-request-timeout"
REQUEST_ID_HEADER = "x-request-id"
VERSION_HEADER = "x-model-version"
SESSION_HEADER = "x-session-id"


@dataclass(frozen=True)
class RequestMeta:
    request_id: str
    priority: Priority | None  # as asked in the header; None = not given
    timeout_s: float | None  # as asked in the header; None = the class default
    authorization: str | None
    version: str | None = None  # X-Model-Version: pins the model's version
    session: str | None = None  # X-Session-ID: keeps a session on one version


def read_meta(headers: Mapping[str, str], max_timeout_s: float) -> RequestMeta:
    """Reads the headers (keys lower-case); a malformed one is a 400 naming it."""
    return RequestMeta(
        request_id=_request_id(headers.get(REQUEST_ID_HEADER)),
        priority=_priority(headers.get(PRIORITY_HEADER), "X-Priority"),
        timeout_s=_timeout(headers.get(TIMEOUT_HEADER), max_timeout_s),
        authorization=headers.get("authorization"),
        version=_capped(headers.get(VERSION_HEADER)),
        session=_capped(headers.get(SESSION_HEADER)),
    )


def _capped(value: str | None) -> str | None:
    return value[:128] if value else None


def choose_priority(header: Priority | None, body: str | None) -> Priority:
    """The class asked for, from the body field or the header (they must agree)."""
    from_body = _priority(body, "priority")
    if header is not None and from_body is not None and header != from_body:
        raise InvalidRequest(
            f"The X-Priority header ({header.label}) and the body's 'priority' "
            f"({from_body.label}) disagree.",
            param="priority",
        )
    # Not `or`: REALTIME is 0, hence falsy.
    if from_body is not None:
        return from_body
    return header if header is not None else Priority.NORMAL


def _request_id(value: str | None) -> str:
    # Serve sets the header (keeping the client's) and echoes it in the response; the
    # fallback is for the app running outside Serve. Capped: it is kept in stats.
    return value[:128] if value else uuid.uuid4().hex


def _priority(value: str | None, where: str) -> Priority | None:
    if value is None:
        return None
    try:
        return Priority.parse(value)
    except ValueError as exc:
        raise InvalidRequest(f"Invalid {where}: {exc}.", param=where) from None


def _timeout(value: str | None, max_timeout_s: float) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds <= max_timeout_s):
        raise InvalidRequest(
            f"X-Request-Timeout must be a number of seconds in (0, {max_timeout_s:g}].",
            param="X-Request-Timeout",
        )
    return seconds
