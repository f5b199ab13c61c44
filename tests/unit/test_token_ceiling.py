"""The warm-up probe's logic with a fake device: bytes = base + per_token x tokens."""

from __future__ import annotations

import pytest

from deployments.core.memory.token_ceiling import ProbePoint, fit_line, gpu_allowance, probe_ceiling

WINDOW = 256
MIB = 2**20


class FakeDevice:
    """A pass of `tokens` peaks at base + per_token x tokens; past `fails_above` it raises
    as a real allocator would."""

    def __init__(
        self, base: int = 8 * MIB, per_token: int = 40_000, fails_above: int | None = None
    ) -> None:
        self.base = base
        self.per_token = per_token
        self.fails_above = fails_above
        self.sizes: list[int] = []

    def bytes_for(self, tokens: int) -> int:
        return self.base + self.per_token * tokens

    def __call__(self, tokens: int) -> int:
        self.sizes.append(tokens)
        if self.fails_above is not None and tokens > self.fails_above:
            raise MemoryError("out of memory")
        return self.bytes_for(tokens)


def test_the_ceiling_fits_within_the_allowed_bytes_and_the_probe_never_passes_them() -> None:
    device = FakeDevice()
    allowed = 500 * MIB
    result = probe_ceiling(device, allowed, WINDOW, max_tokens=1 << 20)
    assert result.tokens is not None
    assert device.bytes_for(result.tokens) <= 0.9 * allowed
    # Close to the best a perfect fit could do: not needlessly small.
    best = (0.9 * allowed - device.base) / device.per_token
    assert result.tokens >= 0.99 * best
    # Every measured pass stayed under the allowed bytes (the probe stops before).
    assert all(device.bytes_for(size) <= allowed for size in device.sizes)
    assert device.sizes == [WINDOW * 2**i for i in range(len(device.sizes))]
    assert 2 * device.sizes[-1] > result.tokens  # it went as far as it could
    assert result.per_token_bytes == pytest.approx(device.per_token)
    assert result.base_bytes == pytest.approx(device.base)
    assert [p.padded_tokens for p in result.points] == device.sizes


def test_the_probe_stops_at_the_largest_configured_budget() -> None:
    device = FakeDevice()
    result = probe_ceiling(device, 10_000 * MIB, WINDOW, max_tokens=16384)
    assert max(device.sizes) == 16384
    assert result.tokens is not None and result.tokens > 16384  # memory does not bind
    assert "largest configured budget" in result.why


def test_every_probed_size_is_whole_rows() -> None:
    device = FakeDevice()
    probe_ceiling(device, 10_000 * MIB, WINDOW, max_tokens=1000)
    assert device.sizes == [256, 512, 768]
    small = FakeDevice()
    probe_ceiling(small, 10_000 * MIB, WINDOW, max_tokens=128)  # one item runs anyway
    assert small.sizes == [256]


def test_the_ceiling_grows_with_the_allowed_bytes() -> None:
    ceilings = []
    for mib in (50, 100, 200, 400, 800, 1600):
        result = probe_ceiling(FakeDevice(), mib * MIB, WINDOW, max_tokens=1 << 20)
        assert result.tokens is not None
        ceilings.append(result.tokens)
    assert ceilings == sorted(ceilings) and len(set(ceilings)) == len(ceilings)


def test_a_budget_below_one_window_still_lets_one_window_run() -> None:
    device = FakeDevice(base=0, per_token=100_000)
    result = probe_ceiling(device, 1 * MIB, WINDOW, max_tokens=16384)
    assert result.tokens == WINDOW
    assert device.sizes == [WINDOW]  # nothing larger was tried
    assert "below one window" in result.why


def test_a_pass_that_runs_out_of_memory_ends_the_probe_below_it() -> None:
    device = FakeDevice(per_token=1_000, fails_above=4 * WINDOW)
    result = probe_ceiling(
        device,
        10_000 * MIB,
        WINDOW,
        max_tokens=1 << 20,
        is_fault=lambda error: isinstance(error, MemoryError),
    )
    assert device.sizes == [WINDOW, 2 * WINDOW, 4 * WINDOW, 8 * WINDOW]
    assert result.tokens == 4 * WINDOW
    assert "ran out of memory" in result.why


def test_any_other_error_is_not_swallowed() -> None:
    def broken(tokens: int) -> int:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        probe_ceiling(broken, 100 * MIB, WINDOW, max_tokens=4096)


def test_no_growth_measured_sets_no_ceiling() -> None:
    result = probe_ceiling(lambda tokens: 0, 100 * MIB, WINDOW, max_tokens=4096)
    assert result.tokens is None
    assert result.report()["token_ceiling"] is None


def test_the_fit_never_has_a_negative_base_or_slope() -> None:
    # A noisy first point (memory the process already had) would tilt the line down.
    points = [ProbePoint(256, 9_000_000), ProbePoint(512, 9_000_000), ProbePoint(1024, 9_500_000)]
    base, per_token = fit_line(points)
    assert base >= 0 and per_token > 0
    points = [ProbePoint(256, 0), ProbePoint(512, 4_000_000), ProbePoint(1024, 12_000_000)]
    base, per_token = fit_line(points)
    assert base == 0 and per_token == pytest.approx(12_000_000 / 1024)


def test_the_gpu_allowance_takes_the_tightest_bound() -> None:
    assert gpu_allowance(1000 * MIB, 0, 0.8) == (800 * MIB, "0.8 of free device memory")
    # Torch's cached but unused blocks count as free: it reuses them first.
    assert gpu_allowance(1000 * MIB, 1000 * MIB, 0.5)[0] == 1000 * MIB
    assert gpu_allowance(1000 * MIB, 0, 0.8, fence_room_bytes=300 * MIB) == (
        300 * MIB,
        "room under gpu_memory_fraction",
    )
    assert gpu_allowance(1000 * MIB, 0, 0.8, 300 * MIB, budget_bytes=100 * MIB) == (
        100 * MIB,
        "memory_budget_mib",
    )
