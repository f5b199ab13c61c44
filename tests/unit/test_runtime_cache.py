"""`runtime: auto`'s choice kept on disk: the key, hits, misses, and files that are wrong.

Fake backends (a forward is a function of the batch) and a fake measurement that counts
its calls, so nothing here times or exports anything.
"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deployments.backends.runtimes import auto as runtime_auto
from deployments.backends.runtimes import cache as runtime_cache
from deployments.backends.runtimes.choice import Choice, Trial, min_cosine

REF = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
OFF = np.array([[1.0, 0.3, 0.0], [0.0, 1.0, 0.0]])  # worst cosine ~0.96


def key(**changes: Any) -> dict[str, Any]:
    parts: dict[str, Any] = {
        "model": {"graph": "_EmbeddingGraph", "digest": "abc", "score_kind": "vector"},
        "hardware": {"device": "cpu", "cpu": "Xeon", "flags": ["amx_bf16"], "gpu": None},
        "libraries": {"torch": "2.13.0", "openvino": "2026.4", "onnxruntime": "1.32.0"},
        "threads": 2,
        "batch_sizes": [1, 8, 64],
        "min_agreement": 0.999,
        "candidates": ["torch-fp32", "openvino-bf16", "onnx"],
        "rounds": 3,
    }
    parts.update(changes)
    return runtime_cache.cache_key(**parts)


@pytest.mark.parametrize(
    "change",
    [
        {"model": {"graph": "_EmbeddingGraph", "digest": "abd", "score_kind": "vector"}},
        {"model": {"graph": "_EmbeddingGraph", "digest": "abc", "score_kind": "score"}},
        {"model": {"graph": "_CrossEncoderGraph", "digest": "abc", "score_kind": "vector"}},
        {"hardware": {"device": "cuda", "cpu": "Xeon", "flags": ["amx_bf16"], "gpu": "H100"}},
        {"hardware": {"device": "cpu", "cpu": "EPYC", "flags": ["amx_bf16"], "gpu": None}},
        {"hardware": {"device": "cpu", "cpu": "Xeon", "flags": [], "gpu": None}},
        {"libraries": {"torch": "2.14.0", "openvino": "2026.4", "onnxruntime": "1.32.0"}},
        {"libraries": {"torch": "2.13.0", "openvino": None, "onnxruntime": "1.32.0"}},
        {"libraries": {"torch": "2.13.0", "openvino": "2026.4", "onnxruntime": "1.33.0"}},
        {"threads": 1},
        {"batch_sizes": [1, 8, 32]},
        {"min_agreement": 0.99},
        {"candidates": ["torch-fp32", "onnx"]},
        {"rounds": 2},
    ],
)
def test_the_key_changes_with_every_part(change: dict[str, Any], tmp_path: Path) -> None:
    assert runtime_cache.digest(key(**change)) != runtime_cache.digest(key())
    assert runtime_cache.cache_path(tmp_path, "g", key(**change)) != runtime_cache.cache_path(
        tmp_path, "g", key()
    )
    # The same parts give the same key, in any order of batch sizes.
    assert runtime_cache.digest(key(batch_sizes=[64, 1, 8])) == runtime_cache.digest(key())


def test_cpu_facts_keep_the_model_name_and_only_the_flags_that_matter() -> None:
    cpuinfo = (
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n"
        "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 avx512_vnni hypervisor\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu\n"
    )
    facts = runtime_cache.cpu_facts(cpuinfo)
    assert facts == {
        "cpu": "Intel(R) Xeon(R) Processor",
        "flags": ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16"],
    }
    assert runtime_cache.hardware("cpu", None)["device"] == "cpu"
    assert set(runtime_cache.library_versions()) == {"torch", "openvino", "onnxruntime"}
    assert runtime_cache.library_versions()["torch"]


class Backends:
    """Builds fake forwards; counts what was built and whether anything was measured."""

    def __init__(self, outputs: dict[str, np.ndarray] | None = None) -> None:
        self.outputs = outputs or {}
        self.built: list[str] = []
        self.measured = 0
        self.broken: set[str] = set()
        self.fastest = "openvino-bf16"

    def build(self, name: str) -> Any:
        self.built.append(name)
        if name in self.broken:
            raise RuntimeError(f"{name} cannot load its export\nsecond line")
        return lambda batch: self.outputs.get(name, REF)

    def measure(self) -> Choice:
        self.measured += 1
        trials = [
            Trial("torch-fp32", 1.0, {1: 10.0}),
            Trial(self.fastest, 0.99995, {1: 30.0}),
            Trial("torch-bf16", None, rejected="failed: RuntimeError: no"),
        ]
        return Choice(self.fastest, self.build(self.fastest), trials, "fastest of 2 ...")


def run(path: Path, backends: Backends, k: dict[str, Any] | None = None) -> tuple[Any, dict]:
    return runtime_auto.keep_or_measure(
        k or key(),
        path,
        backends.build,
        backends.measure,
        probe=2,
        agreement=min_cosine,
        min_agreement=0.999,
        now=lambda: datetime(2026, 11, 24, 23, 8, 5, tzinfo=UTC),
    )


def test_a_first_start_measures_and_keeps_the_choice(tmp_path: Path) -> None:
    path = tmp_path / "runtimes" / "g.json"
    backends = Backends()
    forward, report = run(path, backends)
    assert backends.measured == 1 and forward(2) is REF
    assert report["runtime"] == "openvino-bf16" and report["decided"] == "measured"
    assert report["measured_because"] == "no choice kept yet"
    assert report["cache_file"] == str(path)
    assert report["summary"] == "fastest of 2 agreeing, measured now"
    assert report["measured_at"] == "2026-11-24T23:08:05+00:00"
    record = json.loads(path.read_text())
    assert record["key"] == key() and record["runtime"] == "openvino-bf16"
    # Nothing but the record itself is left behind (no temporary files).
    assert sorted(p.name for p in path.parent.iterdir()) == [".g.json.lock", "g.json"]


def test_a_hit_builds_only_the_kept_runtime_rechecks_it_and_times_nothing(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    run(path, Backends())
    backends = Backends()
    _, report = run(path, backends)
    assert backends.measured == 0
    assert backends.built == ["torch-fp32", "openvino-bf16"]  # the reference for the re-check
    assert report["decided"] == "kept" and report["runtime"] == "openvino-bf16"
    assert report["agreement_now"] == 1.0 and report["cache_file"] == str(path)
    assert report["summary"] == "fastest of 2 agreeing, kept from 2026-11-24 23:08 UTC"
    assert report["candidates"][1]["texts_per_s"] == {"1": 30.0}  # what was measured then
    assert "measured_because" not in report


def test_a_kept_reference_needs_no_recheck(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    first = Backends()
    first.fastest = "torch-fp32"
    run(path, first)
    backends = Backends()
    _, report = run(path, backends)
    assert backends.measured == 0 and backends.built == ["torch-fp32"]
    assert report["decided"] == "kept" and report["runtime"] == "torch-fp32"


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b'{"key": 1}',
        b"\x00\xff\xfe",
        json.dumps({"key": "x", "runtime": "openvino-bf16"}).encode(),
    ],
)
def test_a_corrupt_file_is_measured_again_and_overwritten(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "g.json"
    path.write_bytes(content)
    backends = Backends()
    _, report = run(path, backends)
    assert backends.measured == 1 and report["decided"] == "measured"
    assert report["measured_because"].startswith(("cache file unreadable", "cache file is for"))
    assert json.loads(path.read_text())["key"] == key()
    _, again = run(path, Backends())
    assert again["decided"] == "kept"


def test_a_record_for_another_key_or_runtime_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    run(path, Backends(), key(threads=1))
    backends = Backends()
    _, report = run(path, backends)  # the same file name, another key inside
    assert backends.measured == 1 and report["measured_because"] == "cache file is for another key"
    # A kept runtime that is no longer among the candidates is not trusted either.
    record = json.loads(path.read_text())
    record["runtime"] = record["report"]["runtime"] = "onnx-int8"
    path.write_text(json.dumps(record))
    backends = Backends()
    run(path, backends)
    assert backends.measured == 1


def test_a_kept_runtime_that_no_longer_agrees_is_measured_again(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    run(path, Backends())
    drifted = Backends({"openvino-bf16": OFF})
    drifted.fastest = "onnx"
    _, report = run(path, drifted)
    assert drifted.measured == 1 and report["decided"] == "measured"
    assert report["measured_because"].startswith("kept openvino-bf16 no longer agrees (0.95")
    assert report["runtime"] == "onnx" and json.loads(path.read_text())["runtime"] == "onnx"


def test_a_kept_runtime_that_fails_to_build_is_measured_again(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    run(path, Backends())
    broken = Backends()
    broken.broken = {"openvino-bf16"}
    broken.fastest = "torch-fp32"
    _, report = run(path, broken)
    assert broken.measured == 1
    assert report["measured_because"] == (
        "kept openvino-bf16 failed: RuntimeError: openvino-bf16 cannot load its export"
    )


def test_a_cache_that_cannot_be_written_never_fails_a_start(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = blocker / "runtimes" / "g.json"  # its parent cannot be created
    backends = Backends()
    forward, report = run(path, backends)
    assert backends.measured == 1 and forward(2) is REF
    assert report["cache_file"] is None and report["decided"] == "measured"


def test_concurrent_writers_never_leave_a_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    k = key()
    report = {"runtime": "onnx", "reason": "r" * 20_000, "candidates": []}
    runtime_cache.write(path, k, "onnx", report, "2026-11-24T23:08:05+00:00")
    stop = threading.Event()
    seen: list[str] = []

    def writer() -> None:
        while not stop.is_set():
            runtime_cache.write(path, k, "onnx", report, "2026-11-24T23:08:05+00:00")

    writers = [threading.Thread(target=writer) for _ in range(3)]
    for thread in writers:
        thread.start()
    try:
        for _ in range(300):
            kept, why = runtime_cache.read(path, k)
            seen.append(why if kept is None else "ok")
    finally:
        stop.set()
        for thread in writers:
            thread.join()
    assert set(seen) == {"ok"}
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]
