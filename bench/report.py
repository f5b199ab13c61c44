"""Keep generated results in docs/benchmarks.md between markers, the prose around them
untouched, so a new run replaces its own section and nothing else."""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"


def write_section(path: Path, name: str, body: str) -> None:
    start, end = markers(name)
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else ""
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{block}{tail}"
    else:
        text = f"{text.rstrip()}\n\n{block}\n" if text else f"{block}\n"
    path.write_text(text)
