"""The `runtime` field, runtime availability and applying a choice to a (tiny) model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from deployments.backends.runtimes import build as runtimes
from deployments.backends.runtimes import select as runtime_select
from deployments.config import EmbeddingModelConfig, RerankModelConfig


def test_fp16_is_refused_on_cpu_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"runtime: torch-fp16 runs on a GPU only"):
        EmbeddingModelConfig(name="m", source="x", runtime="torch-fp16")
    gpu = {"ray_actor_options": {"num_gpus": 0.25}}
    assert EmbeddingModelConfig(name="m", source="x", runtime="torch-fp16", deployment=gpu)
    with pytest.raises(runtimes.RuntimeUnavailable, match=r"^runtime: torch-fp16 needs a GPU"):
        runtimes.check_available("torch-fp16", "cpu")
    runtimes.check_available("torch-fp16", "cuda")


def test_config_defaults_and_bad_values() -> None:
    config = RerankModelConfig(name="r", source="x", backend="cross-encoder")
    assert config.runtime == "torch" and config.runtime_min_agreement == 0.999
    with pytest.raises(ValidationError, match="runtime"):
        RerankModelConfig(name="r", source="x", backend="bi-encoder", runtime="tensorrt")
    with pytest.raises(ValidationError, match="runtime_min_agreement"):
        EmbeddingModelConfig(name="m", source="x", runtime_min_agreement=1.5)
    settings = runtime_select.settings_from(EmbeddingModelConfig(name="m", source="x"), 2)
    assert settings.batch_sizes == [1, 8, 32, 64] and settings.threads == 2


def test_a_missing_extra_fails_an_explicit_choice_in_one_line_and_auto_skips_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtimes, "installed", lambda name: runtimes.family(name) == "torch")
    monkeypatch.setattr(runtimes, "cpu_has_bf16", lambda: False)
    with pytest.raises(runtimes.RuntimeUnavailable) as excinfo:
        runtimes.check_available("openvino", "cpu")
    assert "\n" not in str(excinfo.value)
    assert "pip install 'tributary[openvino]'" in str(excinfo.value)
    assert runtimes.auto_candidates("cpu") == ["torch-fp32"]
    assert runtimes.auto_candidates("cuda") == ["torch-fp32", "torch-fp16"]
    monkeypatch.setattr(runtimes, "installed", lambda name: True)
    monkeypatch.setattr(runtimes, "cpu_has_bf16", lambda: True)
    assert runtimes.auto_candidates("cpu") == [
        "torch-fp32",
        "torch-bf16",
        "openvino",
        "openvino-bf16",
        "onnx",
    ]


class TinyModel:
    """A Runnable with a linear 'model': enough to drive apply_runtime on torch."""

    input_names = ["input_ids", "attention_mask"]

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.module = _Linear()
        self.forward = runtimes.TorchForward(self.module, "cpu", torch.float32, copy=False)

    def graph(self) -> torch.nn.Module:
        return self.module

    def sample(self, size: int) -> runtimes.Features:
        ids = (np.arange(size * 4, dtype=np.int64).reshape(size, 4) % 7) + 1
        return {"input_ids": ids, "attention_mask": np.ones_like(ids)}


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(8, 6)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return (self.embed(input_ids) * attention_mask[..., None]).mean(dim=1)


def test_apply_runtime_explicit_and_auto(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    model = TinyModel()
    report = runtime_select.apply_runtime(
        model, "cpu", runtime_select.RuntimeSettings(runtime="torch", dtype="auto")
    )
    assert report["runtime"] == "torch-fp32" and "configured" in report["reason"]
    monkeypatch.setattr(runtimes, "auto_candidates", lambda device: ["torch-fp32", "torch-bf16"])
    settings = runtime_select.RuntimeSettings(
        runtime="auto", batch_sizes=(1, 4), rounds=1, cache_dir=tmp_path
    )
    report = runtime_select.apply_runtime(model, "cpu", settings)
    assert report["decided"] == "measured" and Path(report["cache_file"]).is_file()
    assert report["runtime"] in {"torch-fp32", "torch-bf16"}
    assert [c["runtime"] for c in report["candidates"]] == ["torch-fp32", "torch-bf16"]
    assert set(report["candidates"][0]["texts_per_s"]) == {"1", "4"}
    assert report["min_agreement"] == 0.999
    out = model.forward(model.sample(3))
    assert out.dtype == np.float32 and out.shape == (3, 6)
    # The fp32 graph the model holds is untouched by a bf16 candidate.
    assert model.module.embed.weight.dtype == torch.float32
    # The next start with the same key keeps that choice, measured then.
    again = runtime_select.apply_runtime(TinyModel(), "cpu", settings)
    assert again["decided"] == "kept" and again["runtime"] == report["runtime"]
    assert again["candidates"] == report["candidates"]


def test_dtype_float16_on_cpu_is_refused_naming_the_field() -> None:
    settings = runtime_select.RuntimeSettings(runtime="torch", dtype="float16")
    with pytest.raises(runtimes.RuntimeUnavailable, match=r"^dtype: float16 with runtime: torch"):
        runtime_select.apply_runtime(TinyModel(), "cpu", settings)
    assert runtime_select.torch_runtime("auto", "cuda") == "torch-fp16"
    assert runtime_select.torch_runtime("bfloat16", "cpu") == "torch-bf16"


def test_a_memory_limit_keeps_to_torch_runtimes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for runtime in ("openvino", "openvino-bf16", "onnx", "onnx-int8"):
        with pytest.raises(ValidationError, match="memory_limit_mib works with torch runtimes"):
            EmbeddingModelConfig(name="m", source="x", runtime=runtime, memory_limit_mib=100)
    limited = EmbeddingModelConfig(name="m", source="x", runtime="auto", memory_limit_mib=100)
    assert runtime_select.settings_from(limited, 1).fp32_only
    assert not runtime_select.settings_from(EmbeddingModelConfig(name="m", source="x"), 1).fp32_only
    # auto then keeps the reference, torch fp32.
    monkeypatch.setattr(
        runtimes, "auto_candidates", lambda device: ["torch-fp32", "openvino", "torch-bf16"]
    )
    settings = runtime_select.RuntimeSettings(
        runtime="auto", batch_sizes=(1,), rounds=1, cache_dir=tmp_path, fp32_only=True
    )
    report = runtime_select.apply_runtime(TinyModel(), "cpu", settings)
    assert [c["runtime"] for c in report["candidates"]] == ["torch-fp32"]
    assert report["runtime"] == "torch-fp32"


def test_passes_in_flight_field_and_its_limits() -> None:
    assert EmbeddingModelConfig(name="m", source="x").passes_in_flight == 1
    auto = EmbeddingModelConfig(name="m", source="x", passes_in_flight="auto")
    assert runtime_select.settings_from(auto, 2).passes == "auto"
    with pytest.raises(ValidationError, match="passes_in_flight"):
        EmbeddingModelConfig(name="m", source="x", passes_in_flight=0)
    with pytest.raises(ValidationError, match="runs one forward pass at a time"):
        EmbeddingModelConfig(name="m", source="x", passes_in_flight=2, memory_limit_mib=100)
    assert EmbeddingModelConfig(name="m", source="x", passes_in_flight="auto", memory_limit_mib=100)


def test_passes_auto_is_measured_once_and_kept(tmp_path: Path) -> None:
    settings = runtime_select.RuntimeSettings(
        runtime="torch", batch_sizes=(1, 4), rounds=1, threads=2, cache_dir=tmp_path, passes="auto"
    )
    first = runtime_select.apply_runtime(TinyModel(), "cpu", settings)
    assert first["runtime"] == "torch-fp32" and first["passes_decided"] == "measured"
    assert first["passes_in_flight"] in (1, 2)
    assert set(first["passes_texts_per_s"]) == {"1", "2"}
    again = runtime_select.apply_runtime(TinyModel(), "cpu", settings)
    assert again["passes_decided"] == "kept"
    assert again["passes_in_flight"] == first["passes_in_flight"]


def test_passes_auto_keeps_one_pass_without_measuring_where_it_cannot_help() -> None:
    for threads, fp32_only, why in ((1, False, "one thread"), (2, True, "memory_limit_mib")):
        settings = runtime_select.RuntimeSettings(
            runtime="torch", threads=threads, passes="auto", fp32_only=fp32_only
        )
        report = runtime_select.apply_runtime(TinyModel(), "cpu", settings)
        assert report["passes_in_flight"] == 1 and why in report["passes_reason"]
    configured = runtime_select.RuntimeSettings(runtime="torch", threads=2, passes=2)
    report = runtime_select.apply_runtime(TinyModel(), "cpu", configured)
    assert report["passes_in_flight"] == 2 and report["passes_reason"] == "configured"
