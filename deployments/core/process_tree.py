"""The processes below one, as Linux reports them in /proc/<pid>/stat."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def children_by_parent(proc: Path = PROC) -> dict[int, list[int]]:
    """Every live process's children, by the parent's pid."""
    children: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        try:
            # The name in parentheses may hold spaces; the parent pid follows it.
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return children


def below(root: int, children: dict[int, list[int]]) -> set[int]:
    """Every process under `root` in `children`, however deep."""
    found: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def descendants(root: int, proc: Path = PROC) -> set[int]:
    """Every live process below `root`."""
    return below(root, children_by_parent(proc))
