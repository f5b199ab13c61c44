"""Calls that Serve does not cancel along with the request that made them.

With direct ingress, Serve cancels every call a request made, still in flight, when that
request is cancelled (a client gone): over gRPC, mid-read, which leaks on both sides
(calls/stream_reads.py). A generation stream is ended by its own stop note instead, so it
is made under a request id of its own, known to no request that Serve could cancel. The
id is Serve's private request context; should it change shape, calls are made as before.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("ray.serve")


@contextmanager
def apart_from_request() -> Iterator[None]:
    """Handle calls made inside are not cancelled when the current request is."""
    detached = _detach()
    try:
        yield
    finally:
        if detached is not None:
            context_var, token = detached
            context_var.reset(token)


def _detach() -> tuple[Any, Any] | None:
    """Sets a request context of the call's own; returns what resets it, or None when this
    Ray has no such context (Serve's cancel then stays)."""
    try:
        from ray.serve import context

        current = context._get_serve_request_context()
        own = dataclasses.replace(current, _internal_request_id=uuid.uuid4().hex)
        return context._serve_request_context, context._serve_request_context.set(own)  # type: ignore[arg-type]
    except Exception as exc:
        logger.debug("calls stay tied to their request: %r", exc)
        return None
