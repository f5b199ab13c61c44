"""What counts as running out of memory in a forward pass, and the replica's memory fence.

torch raises `torch.OutOfMemoryError` on CUDA. On a CPU the allocator raises a RuntimeError
("DefaultCPUAllocator: can't allocate memory") when the process hits its address-space limit,
and Python raises MemoryError; ONNX Runtime and OpenVINO say "bad allocation" or "Failed to
allocate". Only these are split and retried; any other error still fails the batch.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import re
import resource
import sys

import torch

from deployments.core.process_status import status_kib

logger = logging.getLogger("ray.serve")

_MEMORY_MESSAGES = re.compile(
    r"out of memory|can't allocate memory|not enough memory|bad allocation|failed to allocate"
    r"|could not create a primitive",
    re.IGNORECASE,
)


def is_memory_fault(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    return isinstance(error, RuntimeError) and bool(_MEMORY_MESSAGES.search(str(error)))


def release_cached_memory() -> None:
    """After a fault: hand the failed pass's cached blocks back before the retry."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def apply_memory_fence(device: str, gpu_memory_fraction: float | None) -> str | None:
    """On a CUDA device, caps this process's share of the card; returns what it set."""
    if gpu_memory_fraction is None:
        return None
    if not device.startswith("cuda"):
        logger.info(
            "gpu_memory_fraction %s ignored: the replica runs on %s", gpu_memory_fraction, device
        )
        return None
    torch.cuda.set_per_process_memory_fraction(gpu_memory_fraction, torch.device(device))
    return f"gpu_memory_fraction {gpu_memory_fraction:g}"


def apply_memory_limit(limit_mib: int | None) -> AddressSpaceLimit | None:
    """On Linux, limits the process's address space to what it uses now plus `limit_mib`, so
    a batch too big for it fails in the allocator (and is split) instead of the kernel's OOM
    killer ending the replica. Call after the model has loaded and warmed up."""
    if limit_mib is None:
        return None
    if not sys.platform.startswith("linux"):
        logger.warning("memory_limit_mib ignored: it needs Linux (RLIMIT_AS)")
        return None
    _return_large_blocks()
    return AddressSpaceLimit(limit_mib)


class AddressSpaceLimit:
    """RLIMIT_AS at the address space the replica holds plus `limit_mib`, set again before
    every pass: the fence bounds what one pass may add, so what the replica keeps between
    passes does not eat the next pass's room. It keeps some for good: the stacks of threads
    that Ray, gRPC and the logging start as requests come (8 MiB of address space each,
    kept by glibc for reuse), heap that a long-lived block pins above freed memory, the code
    oneDNN generates for each new shape. A limit fixed once at warm-up counted all of that
    as spent, and a CI run's fenced replica refused every input alone (413) after a burst
    with no new thread: its room had gone between passes, not in them."""

    def __init__(self, limit_mib: int) -> None:
        self.limit_mib = limit_mib
        self.used_at = _status_count("VmSize") * 1024
        self.threads_at = _status_count("Threads")
        self.base = self.used_at
        self._set()

    @property
    def limit_bytes(self) -> int:
        return self.base + self.limit_mib * 2**20

    def before_pass(self) -> None:
        """Re-bases the limit on the address space held now (one read of /proc/self/status
        and a setrlimit: microseconds, against a pass's milliseconds)."""
        held = status_kib("VmSize")
        if held is not None and held * 1024 != self.base:
            self.base = held * 1024
            self._set()

    def describe(self) -> str:
        return f"address space held before each pass + memory_limit_mib {self.limit_mib}"

    def report(self) -> dict[str, int | None]:
        """The address space when the limit was first set, before the last pass, and now:
        what the replica kept between passes since the fence, and the room left."""
        return {
            "at_limit_bytes": self.used_at,
            "threads_at_limit": self.threads_at,
            "base_bytes": self.base,
            "kept_since_limit_bytes": self.base - self.used_at,
            **address_space(),
        }

    def _set(self) -> None:
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        soft = self.limit_bytes if hard == resource.RLIM_INFINITY else min(self.limit_bytes, hard)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def address_space() -> dict[str, int | None]:
    """The process's address space against its limit (Linux): what a fenced replica has
    left for its passes, and its threads."""
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    used = _status_count("VmSize") * 1024
    limit = None if soft == resource.RLIM_INFINITY else soft
    return {
        "used_bytes": used,
        "limit_bytes": limit,
        "room_bytes": None if limit is None else limit - used,
        "threads": _status_count("Threads"),
    }


def _status_count(field: str) -> int:
    value = status_kib(field)
    if value is None:
        raise OSError(f"/proc/self/status has no {field}")
    return value


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks from this size up get a mapping of their own, handed back when freed.
_LARGE_BLOCK_BYTES = 256 * 1024


def _libc() -> ctypes.CDLL | None:
    """The C library on Linux, where ctypes finds it; None elsewhere."""
    name = ctypes.util.find_library("c")
    if name is None or not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


# jemalloc's mallctl index for "every arena" (MALLCTL_ARENAS_ALL).
_ALL_ARENAS = 4096


def trim_heap() -> None:
    """Return the allocator's free pages to the system, so the RSS is what is used:
    jemalloc's, where it was preloaded (config/allocator.py), by purging every arena;
    else glibc's, by malloc_trim."""
    if not sys.platform.startswith("linux"):
        return
    mallctl = getattr(ctypes.CDLL(None), "mallctl", None)
    if mallctl is not None:
        mallctl(f"arena.{_ALL_ARENAS}.purge".encode(), None, None, None, 0)
        return
    libc = _libc()
    if libc is not None:
        with contextlib.suppress(AttributeError):  # another libc
            libc.malloc_trim(0)


def _return_large_blocks() -> None:
    """glibc only: a pass's large blocks get mappings of their own, unmapped when freed.
    By default glibc raises its mapping threshold to the size of each large block freed,
    so after one big pass blocks of that size come from the heap and stay there: the
    address space a fence allows is then spent for good, and the process's next small
    mapping (a thread's stack, Ray's or gRPC's) fails and aborts the replica. Fixing the
    threshold (which also stops it sliding) keeps the fence's room for the next pass."""
    libc = _libc()
    if libc is None:
        return
    with contextlib.suppress(AttributeError):  # another libc
        libc.mallopt(_M_MMAP_THRESHOLD, _LARGE_BLOCK_BYTES)
        libc.mallopt(_M_TRIM_THRESHOLD, 2 * _LARGE_BLOCK_BYTES)
    trim_heap()
