"""`runtime: auto`'s choice kept on disk, so a restart does not measure again.

A choice is only as good as what it was measured on, so it is keyed by everything that
could change the answer: the model (its weights' digest, the export recipe, the score
kind), the hardware (device, CPU model and the instruction-set flags runtimes dispatch on,
the GPU's name), the library versions, the thread count, the batch sizes timed, the
agreement floor and the candidate list. The file holds the whole key, not only its
digest, and a record whose key differs is ignored. Whatever is wrong with a file (missing,
truncated, not JSON, another schema) makes it a miss, never an error: the caller measures
again and overwrites it. Writes go to a temporary file renamed into place, so a reader
sees a whole record or none, and replicas with the same key measure one at a time under a
file lock (the second one then finds the first one's choice).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bumped when the record's layout or what a choice means changes.
SCHEMA = 1
# The CPU flags the runtimes' kernels dispatch on (oneDNN, OpenVINO, ONNX Runtime): a
# change among them can reorder the candidates.
CPU_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "avx512_vnni",
    "avx_vnni",
    "amx_bf16",
    "amx_fp16",
    "amx_int8",
    "amx_tile",
)
# Distribution names per library (ONNX Runtime ships under several).
LIBRARIES = {
    "torch": ("torch",),
    "openvino": ("openvino",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
}


@dataclass(frozen=True)
class Kept:
    """A choice read back from disk."""

    runtime: str
    report: dict[str, Any]
    measured_at: str
    path: Path


def cpu_facts(cpuinfo: str) -> dict[str, Any]:
    """The CPU's model name and the flags of CPU_FLAGS it has, from /proc/cpuinfo's text."""
    lines = cpuinfo.splitlines()
    name = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags_line = next((ln for ln in lines if ln.startswith("flags")), "")
    flags = set(flags_line.split(":", 1)[-1].split())
    return {"cpu": name, "flags": [f for f in CPU_FLAGS if f in flags]}


def hardware(device: str, gpu_name: str | None = None) -> dict[str, Any]:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: the model name from the platform, no flags
        import platform

        cpuinfo = f"model name: {platform.processor() or platform.machine()}"
    return {"device": device, **cpu_facts(cpuinfo), "gpu": gpu_name}


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for library, distributions in LIBRARIES.items():
        versions[library] = None
        for distribution in distributions:
            try:
                versions[library] = importlib.metadata.version(distribution)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    return versions


def cache_key(
    *,
    model: dict[str, Any],
    hardware: dict[str, Any],
    libraries: dict[str, str | None],
    threads: int,
    batch_sizes: Sequence[int],
    min_agreement: float,
    candidates: Sequence[str],
    rounds: int,
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "model": model,
        "hardware": hardware,
        "libraries": libraries,
        "threads": int(threads),
        "batch_sizes": sorted(int(s) for s in batch_sizes),
        "min_agreement": float(min_agreement),
        "candidates": list(candidates),
        "rounds": int(rounds),
    }


def digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cache_path(cache_dir: Path, name: str, key: dict[str, Any]) -> Path:
    return cache_dir.expanduser() / "runtimes" / f"{name}-{digest(key)}.json"


def read(path: Path, key: dict[str, Any]) -> tuple[Kept | None, str]:
    """The kept choice for `key` at `path`, or None and why not (for the log)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, "no choice kept yet"
    except OSError as exc:
        return None, f"cache file unreadable ({type(exc).__name__})"
    try:
        record = json.loads(data)  # bytes: a bad encoding is a ValueError here
        if record["key"] != key:
            return None, "cache file is for another key"
        runtime, report, measured_at = record["runtime"], record["report"], record["measured_at"]
        if not (isinstance(runtime, str) and isinstance(report, dict)):
            raise TypeError("runtime or report of the wrong type")
        if runtime not in key["candidates"] or report.get("runtime") != runtime:
            raise ValueError(f"kept runtime {runtime!r} is not a candidate")
        return Kept(runtime, report, str(measured_at), path), ""
    except (ValueError, TypeError, KeyError) as exc:
        return None, f"cache file unreadable ({type(exc).__name__})"


def write(
    path: Path, key: dict[str, Any], runtime: str, report: dict[str, Any], measured_at: str
) -> None:
    """Replaces `path` atomically: readers see the old record or the new one, whole."""
    record = {
        "key": key,
        "runtime": runtime,
        "measured_at": measured_at,
        "report": report,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, staging = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(record, out, indent=1, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(staging, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        raise


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Held while a replica reads, measures and writes `path`: replicas with the same key
    that start together measure once (measuring side by side would also skew both)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with (path.parent / f".{path.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
