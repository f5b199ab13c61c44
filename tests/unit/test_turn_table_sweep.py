"""Tables of Ray nodes that are gone are removed; a table anyone alive holds is kept."""

import os
from pathlib import Path

from deployments.core.device_turns.sweep import sweep_tables
from deployments.core.device_turns.table import TurnTable


def table(directory: Path, name: str, pids: list[int]) -> Path:
    path = directory / f"{name}-cpu.turns"
    turns = TurnTable(path, 2, 2.0)
    with turns.locked() as locked:
        for pid in pids:
            locked.claim(pid, lambda _: True)
    turns.close()
    (directory / f"{path.name}.0.sock").write_bytes(b"")
    return path


def test_a_table_whose_holders_are_all_dead_goes_with_its_sockets(tmp_path: Path) -> None:
    alive = {os.getpid()}
    dead = table(tmp_path, "gone", [999_999_001, 999_999_002])
    held = table(tmp_path, "live", [os.getpid(), 999_999_003])
    mine = table(tmp_path, "mine", [999_999_004])
    later = os.stat(dead).st_mtime + 3600
    removed = sweep_tables(tmp_path, keep=mine, is_alive=alive.__contains__, now=later)
    assert removed == [dead]
    assert not dead.exists() and not (tmp_path / f"{dead.name}.0.sock").exists()
    assert held.exists() and mine.exists()  # someone alive; and the caller's own


def test_a_fresh_table_and_a_file_of_another_layout_are_left_alone(tmp_path: Path) -> None:
    fresh = table(tmp_path, "fresh", [999_999_005])
    other = tmp_path / "other-cpu.turns"
    other.write_bytes(b"not a table")
    elsewhere = tmp_path / "x.turns"
    now = os.stat(fresh).st_mtime + 10  # under the age guard
    assert sweep_tables(tmp_path, keep=elsewhere, is_alive=lambda _: False, now=now) == []
    later = now + 3600
    assert sweep_tables(tmp_path, keep=elsewhere, is_alive=lambda _: False, now=later) == [fresh]
    assert other.exists()
