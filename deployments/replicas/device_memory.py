"""What a replica's device holds and what one forward pass takes from it: the measurements
behind the warm-up probe (`core/memory/token_ceiling.py`) and the device figures of /v1/stats.

On CUDA torch counts its own allocations exactly: a pass's cost is its peak allocation
(`max_memory_allocated` after `reset_peak_memory_stats`) above what was allocated before it,
and the card's free memory comes from `mem_get_info`. Utilisation needs NVML (`pynvml`);
without it the figure is left out rather than guessed.

On a CPU nothing counts a pass's tensors, so the process's resident memory stands in. Before
the probe, glibc's free memory is handed back (`malloc_trim`) and the RSS read once: the
base. Linux resets the peak RSS (VmHWM) when "5" is written to /proc/self/clear_refs, so a
pass's cost is its peak minus that base: what the pass adds to the loaded model, the
quantity `memory_budget_mib` names. The base is taken once, not before every pass, because
the allocator keeps (resident) much of what the previous pass freed and the next pass reuses
it; measured from the RSS just before, a pass would look half its size. tracemalloc would
miss torch's allocations altogether. Where the peak cannot be reset (not Linux),
`getrusage`'s lifetime peak is used, which is right for passes that grow, as the probe's do.
"""

from __future__ import annotations

import logging
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from deployments.core.memory.token_ceiling import TokenCeiling, gpu_allowance, probe_ceiling
from deployments.core.process_status import status_kib
from deployments.replicas.memory import is_memory_fault, release_cached_memory, trim_heap

logger = logging.getLogger("ray.serve")

MIB = 2**20
# The share of the allowed bytes the ceiling's predicted pass may use. torch's CUDA counters
# are exact; the same pass's peak RSS moved by about 10 % between runs and 15 % between
# processes here (docs/operations.md, "Memory budgets"), so a CPU ceiling keeps more slack.
GPU_MARGIN = 0.9
CPU_MARGIN = 0.8
_PROC = Path("/proc/self")


def _meminfo_kib() -> dict[str, int]:
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return {}
    return {line.split(":")[0]: int(line.split()[1]) for line in lines if line.endswith("kB")}


def _reset_peak_rss() -> bool:
    try:
        (_PROC / "clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _lifetime_peak_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes there, KiB on Linux


class DeviceMemory:
    """One replica's device: `measure` for the probe, `snapshot` for /v1/stats."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.cuda = device.startswith("cuda")
        self._base: int | None = None  # the CPU probe's RSS base (`settle`)

    def rss_bytes(self) -> int | None:
        kib = status_kib("VmRSS")
        return None if kib is None else kib * 1024

    def settle(self) -> int:
        """Before a series of `measure`s on a CPU: trims the heap and returns the RSS that
        every pass is measured from."""
        trim_heap()
        self._base = self.rss_bytes() or 0
        return self._base

    def measure(self, run: Callable[[], object]) -> int:
        """Runs `run` (one forward pass) and returns the bytes it took at its peak above
        what was allocated before it (GPU) or above the base `settle` read (CPU)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            run()
            torch.cuda.synchronize(self.device)
            return int(torch.cuda.max_memory_allocated(self.device) - before)
        base = self.settle() if self._base is None else self._base
        if _reset_peak_rss():
            run()
            peak = status_kib("VmHWM")
            return max((peak or 0) * 1024 - base, 0)
        run()
        return max(_lifetime_peak_bytes() - base, 0)

    def allowance(
        self,
        probe_fraction: float | None,
        budget_mib: int | None,
        fence: float | None,
    ) -> tuple[int, str] | None:
        """The bytes the probe may use and why; None when nothing asks for a ceiling."""
        budget = None if budget_mib is None else budget_mib * MIB
        if not self.cuda:
            return None if budget is None else (budget, "memory_budget_mib")
        if probe_fraction is None:
            return None if budget is None else (budget, "memory_budget_mib")
        free, total = torch.cuda.mem_get_info(self.device)
        allocated = torch.cuda.memory_allocated(self.device)
        cached = torch.cuda.memory_reserved(self.device) - allocated
        fence_room = None if fence is None else int(fence * total) - allocated
        return gpu_allowance(free, cached, probe_fraction, fence_room, budget)

    def probe(
        self,
        run_rows: Callable[[int], object],
        window: int,
        max_tokens: int,
        allowed_bytes: int,
    ) -> TokenCeiling:
        """Passes of growing rows of `window` tokens, up to `max_tokens` padded tokens."""

        def measure(padded_tokens: int) -> int:
            rows = max(padded_tokens // window, 1)
            return self.measure(lambda: run_rows(rows))

        if not self.cuda:
            self.settle()
        try:
            return probe_ceiling(
                measure,
                allowed_bytes,
                window,
                max_tokens,
                margin=GPU_MARGIN if self.cuda else CPU_MARGIN,
                is_fault=is_memory_fault,
            )
        finally:
            # The probe's largest pass leaves cached blocks behind; serving reuses them,
            # but /v1/stats should not show them as the model's.
            release_cached_memory()

    def snapshot(self) -> dict[str, Any]:
        """The device's memory now, and its utilisation where it can be read."""
        if not self.cuda:
            info = _meminfo_kib()
            return {
                "kind": "cpu",
                "total_bytes": info.get("MemTotal", 0) * 1024 or None,
                "free_bytes": info.get("MemAvailable", 0) * 1024 or None,
                "process_bytes": self.rss_bytes(),
                "process_measure": "rss",
            }
        free, total = torch.cuda.mem_get_info(self.device)
        return {
            "kind": "cuda",
            "name": torch.cuda.get_device_name(self.device),
            "total_bytes": int(total),
            "free_bytes": int(free),
            "used_bytes": int(total - free),
            "process_bytes": int(torch.cuda.memory_allocated(self.device)),
            "process_measure": "torch allocated",
            "reserved_bytes": int(torch.cuda.memory_reserved(self.device)),
            "peak_bytes": int(torch.cuda.max_memory_allocated(self.device)),
            **({} if (util := self.utilization()) is None else {"utilization_percent": util}),
        }

    def utilization(self) -> int | None:
        """The GPU's busy percent over the last sample period (NVML); None without it."""
        try:
            return int(torch.cuda.utilization(self.device))
        except Exception as error:  # no pynvml (ImportError), NVML missing or refusing
            logger.debug("GPU utilisation unavailable: %s", error)
            return None
