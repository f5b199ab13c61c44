"""KV-cache tokens and sequence counts from memory, and as configured."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from deployments.backends.generation.causal_lm import CausalLM, resolve_lm_source
from deployments.config import GenerationModelConfig
from deployments.core.memory.kv_budget import MAX_DERIVED_TOKENS, MIN_PAGES, KvShape, derive
from deployments.replicas.generation.generator import kv_budget

# A 7B-like shape in fp16: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes.
SEVEN_B = KvShape(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)


def test_bytes_per_token() -> None:
    assert SEVEN_B.bytes_per_token == 131072  # 128 KiB per token


def test_a_budget_divides_into_whole_pages_and_sequences() -> None:
    got = derive(SEVEN_B, 10 * 2**30, "10 GiB", 32, 512, None, None)
    assert got.kv_cache_tokens == 81920  # 10 GiB / 128 KiB, a multiple of 32
    assert got.max_num_seqs == 160  # 81920 / 512
    assert "10 GiB" in got.source


def test_configured_figures_win() -> None:
    got = derive(SEVEN_B, 10 * 2**30, "10 GiB", 32, 512, 4096, 8)
    assert (got.kv_cache_tokens, got.max_num_seqs) == (4096, 8)
    assert got.source == "kv_cache_tokens as configured; max_num_seqs as configured"
    seqs_only = derive(SEVEN_B, None, "", 32, 512, 4096, None)
    assert seqs_only.max_num_seqs == 8


def test_derived_sizes_stay_within_bounds() -> None:
    tiny = derive(SEVEN_B, 1, "1 byte", 32, 512, None, None)
    assert tiny.kv_cache_tokens == MIN_PAGES * 32 and tiny.max_num_seqs == 1
    huge = derive(KvShape(1, 1, 8, 2), 2**40, "1 TiB", 32, 64, None, None)
    assert huge.kv_cache_tokens == MAX_DERIVED_TOKENS and huge.max_num_seqs == 256


def test_no_budget_and_no_size_is_an_error() -> None:
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        derive(SEVEN_B, None, "", 32, 512, None, None)


def test_the_demo_model_on_a_cpu_derives_from_its_memory_budget(tmp_path: Path) -> None:
    lm = CausalLM(resolve_lm_source("demo:tiny-llama", tmp_path))
    shape = lm.kv_shape()
    config = lm.model.config
    assert shape.layers == config.num_hidden_layers and shape.dtype_bytes == 4
    model = GenerationModelConfig.model_validate(
        {
            "name": "llm",
            "source": "demo:tiny-llama",
            "kv_cache_tokens": None,
            "max_num_seqs": None,
            "kv_cache_memory_mib": 1,
            "default_max_tokens": 64,
        }
    )
    got = kv_budget(model, lm, "cpu")
    expected = (2**20 // (shape.bytes_per_token * model.page_size)) * model.page_size
    assert got.kv_cache_tokens == max(expected, MIN_PAGES * model.page_size)
    assert got.max_num_seqs == max(got.kv_cache_tokens // 128, 1)
    assert "kv_cache_memory_mib 1" in got.source


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_budget_is_a_share_of_free_memory(tmp_path: Path) -> None:
    lm = CausalLM(resolve_lm_source("demo:tiny-llama", tmp_path), "cuda", torch.float16)
    model = GenerationModelConfig.model_validate(
        {"name": "llm", "source": "demo:tiny-llama", "kv_cache_tokens": None}
    )
    free, _ = torch.cuda.mem_get_info()
    got = kv_budget(model, lm, "cuda")
    per_token = lm.kv_shape().bytes_per_token
    assert got.kv_cache_tokens <= free * 0.5 / per_token + model.page_size
    assert "GiB free" in got.source
