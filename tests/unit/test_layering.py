"""The rooms of deployments/ and which way their imports may point.

Every import counts: module level, function-local and under TYPE_CHECKING alike, because
each is a dependency a reader has to follow. Imports point only down the ranks below; the
ingress and the model replicas run in different processes, so neither imports the other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import deployments

ROOT = Path(deployments.__file__).parent

# Lowest first: module prefix -> (rank, room). A module not named here is a wiring module at
# the top (app, launch, CLIs). The shared top-level modules are one room: they may import
# each other (the cycle test still watches them).
RANKS: dict[str, tuple[int, str]] = {
    "deployments.core": (0, "core"),
    "deployments.backends": (1, "backends"),
    "deployments.config": (2, "shared"),
    "deployments.config_base": (2, "shared"),
    "deployments.config_cache": (2, "shared"),
    "deployments.config_batches": (2, "shared"),
    "deployments.config_generation": (2, "shared"),
    "deployments.config_traffic": (2, "shared"),
    "deployments.serve_options": (2, "shared"),
    "deployments.errors": (2, "shared"),
    "deployments.metrics": (2, "shared"),
    "deployments.ingress": (3, "ingress"),
    "deployments.replicas": (3, "replicas"),
    "deployments.http": (4, "http"),
    # What the launcher prints: below it, imports nothing of ours.
    "deployments.launch_output": (4, "launch-output"),
    # The launcher's helpers below it: its instance's files (nothing of ours) and what the
    # config asks of the machine (reads the config).
    "deployments.launch_paths": (4, "launch-paths"),
    "deployments.launch_placement": (4, "launch-placement"),
}
TOP = 5


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """The deployments modules that `path` imports, resolving `from pkg import module`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in found if m in known and m != name}


def rank(module: str) -> tuple[int, str]:
    for prefix, (level, room) in RANKS.items():
        if module == prefix or module.startswith(prefix + "."):
            return level, room
    return TOP, module


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    known = set(modules)
    graph = {name: imports_of(path, name, known) for name, path in modules.items()}
    # A package's __init__ is not a dependency of its own modules' imports of siblings.
    return {name: {m for m in deps if not name.startswith(m + ".")} for name, deps in graph.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_graph_sees_the_packages() -> None:
    graph = import_graph()
    assert "deployments.ingress.ingress" in graph
    assert "deployments.core.admission" in graph["deployments.ingress.model_client"]


def test_local_and_relative_imports_count(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from deployments.core import priority\n"
        "def late():\n    from . import errors\n    import deployments.http.server\n"
    )
    known = {"deployments.core.priority", "deployments.errors", "deployments.http.server"}
    assert imports_of(source, "deployments.config", known) == known


def test_no_import_cycle() -> None:
    assert find_cycle(import_graph()) is None


def test_a_cycle_is_found() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_imports_point_only_down() -> None:
    upward = []
    for name, deps in import_graph().items():
        level, room = rank(name)
        for dep in deps:
            dep_level, dep_room = rank(dep)
            if dep_level > level or (dep_level == level and dep_room != room):
                upward.append(f"{name} -> {dep}")
    assert sorted(upward) == []


def test_every_room_is_ranked() -> None:
    rooms = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {f"deployments.{r}" for r in rooms} <= set(RANKS)
