import os
import time
import tracemalloc
from pathlib import Path

import pytest

from deployments.core.allocation_trace import DIRECTORY_VARIABLE, growth_report, trace_allocations


def test_without_the_variable_nothing_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DIRECTORY_VARIABLE, raising=False)
    assert trace_allocations("ingress") is False
    assert not tracemalloc.is_tracing()


def test_the_report_names_the_line_that_kept_growing() -> None:
    kept: list[bytes] = []
    tracemalloc.start(6)
    try:
        first = tracemalloc.take_snapshot()
        for _ in range(200):
            kept.append(bytes(4096))  # the leak: 800 KiB held from this line
        now = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    report = growth_report(first, now, minutes=2.0)
    assert report.startswith("after 2.0 min:")
    top = report.split("\n\n")[0] + report.split("\n\n")[1]
    assert "test_allocation_trace.py" in top
    assert "kept.append(bytes(4096))" in top
    grown_kib = float(report.split("\n")[2].split(" KiB")[0])
    assert grown_kib >= 790
    assert len(kept) == 200


def test_with_the_variable_the_process_writes_its_growth_there(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(DIRECTORY_VARIABLE, str(tmp_path / "trace"))
    monkeypatch.setenv("TRIBUTARY_TRACE_EVERY_S", "0.1")
    try:
        assert trace_allocations("embed all/MiniLM") is True
        written = tmp_path / "trace" / f"embed_all_MiniLM-{os.getpid()}.txt"
        deadline = time.monotonic() + 10
        while not written.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert written.read_text().startswith("after ")
        log = written.with_suffix(".log").read_text().splitlines()
        assert log and " min  traced " in log[0] and " rss " in log[0]
    finally:
        tracemalloc.stop()
