"""A Recorder that gathers values in memory and hands them on once a second.

Recording straight into Ray's metric objects costs a few microseconds a value (tags merged
and checked in Python, then a call into the core worker), and the request path records
several values per request: a counter, a latency, two queue-depth gauges at the ingress;
sizes, tokens and one queue wait per input at a replica. On two cores every microsecond
the path spends is taken from the model. Here a counter's increments are summed and a
gauge keeps its last value, so each costs one dictionary update per record and one call
into Ray per flush; histogram observations are kept and observed at the flush, off the
request's own time. What Prometheus sees is the same, up to `flush_every_s` later (Ray's
own export runs every few seconds anyway). Values not yet flushed when the process dies
are lost, at most one interval's worth.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from deployments.core.metrics.metric_series import Kind, Series
from deployments.core.metrics.metrics import Recorder

FLUSH_EVERY_S = 1.0

logger = logging.getLogger(__name__)

Key = tuple[str, tuple[tuple[str, str], ...]]


class BufferedRecorder:
    def __init__(self, inner: Recorder, flush_every_s: float = FLUSH_EVERY_S) -> None:
        self._inner = inner
        self._flush_every_s = flush_every_s
        self._lock = threading.Lock()
        self._series: dict[Key, tuple[Series, dict[str, str]]] = {}
        self._sums: dict[Key, float] = {}
        self._last: dict[Key, float] = {}
        self._observed: dict[Key, list[float]] = {}
        self._flusher: threading.Thread | None = None
        self._stopped = threading.Event()

    def record(self, series: Series, value: float, labels: Mapping[str, str]) -> None:
        key: Key = (series.name, tuple(labels.items()))
        with self._lock:
            if key not in self._series:
                self._series[key] = (series, dict(labels))
            if series.kind is Kind.COUNTER:
                self._sums[key] = self._sums.get(key, 0.0) + value
            elif series.kind is Kind.HISTOGRAM:
                self._observed.setdefault(key, []).append(value)
            else:
                self._last[key] = value
            if self._flusher is None:
                self._start_flusher()

    def flush(self) -> None:
        """Hands everything gathered so far to the inner recorder."""
        with self._lock:
            sums, self._sums = self._sums, {}
            last, self._last = self._last, {}
            observed, self._observed = self._observed, {}
            series = dict(self._series)
        for key, total in sums.items():
            self._put(series[key], total)
        for key, value in last.items():
            self._put(series[key], value)
        for key, values in observed.items():
            for value in values:
                self._put(series[key], value)

    def stop(self) -> None:
        """Flushes and ends the background thread (tests; a replica just exits)."""
        self._stopped.set()
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        self.flush()

    def _put(self, entry: tuple[Series, dict[str, str]], value: float) -> None:
        series, labels = entry
        self._inner.record(series, value, labels)

    def _start_flusher(self) -> None:
        # Called with the lock held, once.
        self._flusher = threading.Thread(
            target=self._flush_forever, name="tributary-metrics-flush", daemon=True
        )
        self._flusher.start()

    def _flush_forever(self) -> None:
        while not self._stopped.wait(self._flush_every_s):
            try:
                self.flush()
            except Exception:  # a metrics fault must not end the flushing for good
                logger.exception("could not flush metrics")
