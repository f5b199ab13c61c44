"""One record per API request at the ingress: its labels, its final status, its latency.

`@observed` wraps an `Ingress` route method (embed, rerank, ...). The method fills in
what it learns as it goes with `note_request(model=..., priority=...)`; the wrapper
decides the final status from how the method ended (an answer, a TributaryError, a
cancel when the client left) and hands the record to the `RequestObserver`, which feeds
Prometheus (through core.metrics) and the recent-requests window of `GET /v1/stats`.
A context variable carries the record so that helpers deep in the call need no extra
parameter. A streaming answer is recorded when the method returns its response, before
the stream ends; its token timings belong to `TributaryMetrics.first_token` and
`inter_token`, recorded where the tokens are made.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from deployments.core.metrics.live_stats import RecentRequests
from deployments.core.metrics.metrics import CLIENT_GONE_STATUS, UNKNOWN, TributaryMetrics
from deployments.errors import TributaryError


@dataclass
class RequestRecord:
    started: float = field(default_factory=time.monotonic)
    model: str = UNKNOWN
    version: str = UNKNOWN
    priority: str = UNKNOWN
    items: int = 0


_current: ContextVar[RequestRecord | None] = ContextVar("tributary_request", default=None)


def note_request(
    *,
    model: str | None = None,
    version: str | None = None,
    priority: str | None = None,
    items: int | None = None,
) -> None:
    """Labels for the request being served; a no-op outside an `@observed` method."""
    record = _current.get()
    if record is None:
        return
    if model is not None:
        record.model = model
    if version is not None:
        record.version = version
    if priority is not None:
        record.priority = priority
    if items is not None:
        record.items = items


def request_started() -> float | None:
    """When the request being served reached this ingress (time.monotonic()); None outside
    an `@observed` method."""
    record = _current.get()
    return None if record is None else record.started


class RequestObserver:
    def __init__(self, metrics: TributaryMetrics) -> None:
        self.metrics = metrics
        self._recent: dict[tuple[str, str], RecentRequests] = {}

    def finish(self, record: RequestRecord, status: int, code: str | None) -> None:
        latency_s = time.monotonic() - record.started
        self.metrics.request_finished(
            record.model, record.version, record.priority, status, code, latency_s
        )
        if record.model == UNKNOWN or record.priority == UNKNOWN:
            return  # refused before it reached a model's queue: not that queue's figure
        key = (record.model, record.priority)
        recent = self._recent.get(key)
        if recent is None:
            recent = self._recent[key] = RecentRequests()
        recent.add(latency_s, record.items, ok=status < 400)

    def recent(self, model: str, priority: str) -> dict[str, Any]:
        recent = self._recent.get((model, priority))
        return (recent or RecentRequests()).summary()


class _Observed(Protocol):
    observer: RequestObserver


S = TypeVar("S", bound=_Observed)
P = ParamSpec("P")
R = TypeVar("R")


def observed(
    method: Callable[Concatenate[S, P], Awaitable[R]],
) -> Callable[Concatenate[S, P], Awaitable[R]]:
    @functools.wraps(method)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        record = RequestRecord()
        token = _current.set(record)
        try:
            answer = await method(self, *args, **kwargs)
        except TributaryError as exc:
            self.observer.finish(record, exc.status, exc.code)
            raise
        except asyncio.CancelledError:
            # The client went away and Serve cancelled its handler.
            self.observer.finish(record, CLIENT_GONE_STATUS, None)
            raise
        except Exception:
            self.observer.finish(record, 500, None)  # the HTTP app answers 500 too
            raise
        finally:
            _current.reset(token)
        self.observer.finish(record, 200, None)
        return answer

    return wrapper
