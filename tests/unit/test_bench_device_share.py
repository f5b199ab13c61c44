"""bench/device_share.py's pieces that need no server: the config it serves, the figures it
reads off /v1/stats, and its tables."""

from __future__ import annotations

import argparse
from typing import Any

from bench import device_share
from bench.device_share import EMBEDDER, LLM, RERANKER, Setting, Swap
from deployments.config import AppConfig


def arguments(**overrides: Any) -> argparse.Namespace:
    values: dict[str, Any] = {
        "one_card": False,
        "config": None,
        "passes_at_once": None,
        "rounds": 1,
        "duration": 15.0,
        "rate": 5.0,
        "swap_only": False,
        "swap_connections": 4,
    }
    return argparse.Namespace(**{**values, **overrides})


def stats(by_model: dict[str, dict[str, float]]) -> dict[str, Any]:
    """/v1/stats as the bench reads it: each model's turns of one class."""
    models: dict[str, Any] = {LLM: {"replica": {}}}
    for name, figures in by_model.items():
        models[name] = {"replica": {"device_turns": {"by_class": {"2": figures}}}}
    return {"models": models}


def test_passes_at_once_overrides_the_configs_and_the_rest_of_the_arbiter_stays() -> None:
    config = device_share.config_with(arguments(passes_at_once=1, one_card=True), arbiter=True)
    app = config["applications"][0]["args"]
    assert app["device_arbiter"]["passes_at_once"] == 1
    assert app["device_arbiter"]["enabled"] is True
    assert app["embedding_models"][0]["deployment"]["ray_actor_options"]["num_gpus"] == 0.25
    AppConfig.model_validate(app)

    as_configured = device_share.config_with(arguments(), arbiter=False)
    arbiter = as_configured["applications"][0]["args"]["device_arbiter"]
    assert arbiter["passes_at_once"] == "auto" and arbiter["enabled"] is False


def test_mean_waits_and_shares_are_of_the_window_between_two_reads() -> None:
    before = stats(
        {
            EMBEDDER: {"turns": 10, "wait_s": 0.1, "held_s": 1.0},
            RERANKER: {"turns": 5, "wait_s": 0.5, "held_s": 1.0},
        }
    )
    after = stats(
        {
            EMBEDDER: {"turns": 20, "wait_s": 0.2, "held_s": 2.0},
            RERANKER: {"turns": 15, "wait_s": 1.5, "held_s": 4.0},
        }
    )
    assert device_share.mean_waits_ms(before, after) == {EMBEDDER: 10.0, RERANKER: 100.0}
    shares = device_share.shares_between(
        device_share.held_by_model(before), device_share.held_by_model(after)
    )
    assert shares == {EMBEDDER: 0.25, RERANKER: 0.75, LLM: 0.0}


def test_a_swap_only_run_renders_the_swap_without_the_on_off_table() -> None:
    swaps = [
        Swap({EMBEDDER: 10, RERANKER: 0}, {EMBEDDER: 0.55, RERANKER: 0.45}, 0.05, {}),
        Swap(
            {EMBEDDER: 0, RERANKER: 10},
            {EMBEDDER: 0.18, RERANKER: 0.82},
            0.05,
            {EMBEDDER: 47.5, RERANKER: 0.6},
        ),
    ]
    text = device_share.render([], swaps, arguments(swap_only=True, passes_at_once=1))
    assert "rounds" not in text and "medians" not in text and "passes at once: 1" in text
    assert "| 0 / 10 | 0.180 | 0.820 | 47.50 / 0.60 |" in text
    assert "| 10 / 0 | 0.550 | 0.450 | 0.00 / 0.00 |" in text
    assert "Flood throughput" not in text


def test_the_on_off_table_compares_the_first_setting_with_the_last() -> None:
    on, off = Setting(arbiter=True), Setting(arbiter=False)
    for setting, docs in ((on, 90.0), (off, 100.0)):
        setting.rounds.append(device_share.Round(10.0, 20.0, 15.0, 30.0, 0, docs, 1000.0, 0))
    text = device_share.render([on, off], [], arguments())
    assert "| on | 10.0 / 20.0 | 15.0 / 30.0 | **1.50x** | 90 | 1000 | 0 |" in text
    assert "rerank 0.90x, LLM 1.00x" in text
