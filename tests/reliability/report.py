"""What a reliability run measured: each test adds its section; the session prints them
and writes them as JSON under bench/results/ (gitignored)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.server import ROOT

RESULTS_DIR = ROOT / "bench" / "results"

_sections: dict[str, dict[str, Any]] = {}


def record(section: str, figures: dict[str, Any]) -> None:
    _sections[section] = figures


def sections() -> dict[str, dict[str, Any]]:
    return dict(_sections)


def write(meta: dict[str, Any]) -> Path | None:
    if not _sections:
        return None
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / time.strftime("reliability-%Y%m%d-%H%M%S.json")
    document = {"meta": meta, **_sections}
    path.write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")
    return path


def summary_lines() -> list[str]:
    lines = []
    for name, figures in _sections.items():
        lines.append(f"[{name}]")
        for key, value in figures.items():
            if key == "failures":
                lines.append(f"  failures: {len(value)}")
                lines.extend(f"    - {failure}" for failure in value[:10])
            else:
                lines.append(f"  {key}: {json.dumps(value, default=str)}")
    return lines


def command_line() -> str:
    return " ".join(sys.argv)
