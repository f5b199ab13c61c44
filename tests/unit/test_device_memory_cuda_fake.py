"""DeviceMemory's CUDA branch against a fake `torch.cuda` (no GPU here): which counters it
reads, how it turns them into the probe's allowance, a pass's peak and the /v1/stats
snapshot. The real card is exercised by test_token_ceiling_real's GPU test where there is one."""

from __future__ import annotations

import pytest
import torch

from deployments.replicas.device_memory import MIB, DeviceMemory

GIB = 1024 * MIB
PER_TOKEN = 60_000


class FakeCuda:
    """A 80 GiB card with 70 GiB free; torch has 1 GiB allocated and 1.5 GiB reserved."""

    def __init__(self, utilization: int | None = None) -> None:
        self.allocated = 1 * GIB
        self.peak = self.allocated
        self.utilization_percent = utilization
        self.synced = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "mem_get_info", lambda device=None: (70 * GIB, 80 * GIB))
        monkeypatch.setattr(cuda, "memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(cuda, "memory_reserved", lambda device=None: self.allocated + GIB // 2)
        monkeypatch.setattr(cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(cuda, "synchronize", self.sync)
        monkeypatch.setattr(cuda, "get_device_name", lambda device=None: "Fake H100")
        monkeypatch.setattr(cuda, "utilization", self.utilization)
        monkeypatch.setattr(cuda, "empty_cache", lambda: None)

    def reset(self, device: object = None) -> None:
        self.peak = self.allocated

    def sync(self, device: object = None) -> None:
        self.synced += 1

    def utilization(self, device: object = None) -> int:
        if self.utilization_percent is None:
            raise ModuleNotFoundError("pynvml does not seem to be installed")
        return self.utilization_percent

    def run(self, rows: int) -> None:
        """A pass: its activations rise above what was allocated, then are freed."""
        self.peak = max(self.peak, self.allocated + rows * 256 * PER_TOKEN)


def test_the_allowance_is_a_fraction_of_free_plus_cached_under_the_fence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakeCuda().install(monkeypatch)
    device = DeviceMemory("cuda")
    assert device.allowance(0.8, None, None) == (int(0.8 * 70.5 * GIB), "0.8 of free device memory")
    # A fence of 10 % of 80 GiB leaves 8 GiB less the 1 GiB allocated.
    assert device.allowance(0.8, None, 0.1) == (
        int(0.1 * 80 * GIB) - GIB,
        "room under gpu_memory_fraction",
    )
    assert device.allowance(0.8, 512, None) == (512 * MIB, "memory_budget_mib")
    assert device.allowance(None, None, None) is None  # probe off


def test_a_pass_is_its_peak_allocation_above_what_was_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeCuda()
    fake.install(monkeypatch)
    device = DeviceMemory("cuda")
    assert device.measure(lambda: fake.run(4)) == 4 * 256 * PER_TOKEN
    assert fake.synced == 2  # before and after: the pass's kernels have finished
    allowed = 512 * MIB
    result = device.probe(fake.run, 256, 1 << 20, allowed)
    assert result.tokens is not None
    assert PER_TOKEN * result.tokens <= 0.9 * allowed
    assert result.per_token_bytes == pytest.approx(PER_TOKEN)
    assert all(p.peak_bytes <= allowed for p in result.points)


@pytest.mark.parametrize("utilization", [None, 37])
def test_the_snapshot_shows_the_card_and_utilisation_only_where_nvml_answers(
    monkeypatch: pytest.MonkeyPatch, utilization: int | None
) -> None:
    FakeCuda(utilization).install(monkeypatch)
    snapshot = DeviceMemory("cuda").snapshot()
    assert snapshot["kind"] == "cuda" and snapshot["name"] == "Fake H100"
    assert (snapshot["total_bytes"], snapshot["free_bytes"]) == (80 * GIB, 70 * GIB)
    assert snapshot["used_bytes"] == 10 * GIB and snapshot["process_bytes"] == GIB
    assert snapshot.get("utilization_percent") == utilization
    assert ("utilization_percent" in snapshot) == (utilization is not None)
