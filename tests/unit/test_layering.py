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
# the top (app, the launcher's main, the CLIs). The shared rank-2 modules are one room: they may
# import each other (the cycle test still watches them).
RANKS: dict[str, tuple[int, str]] = {
    "deployments.core": (0, "core"),
    "deployments.backends": (1, "backends"),
    "deployments.config": (2, "shared"),
    "deployments.errors": (2, "shared"),
    "deployments.metrics": (2, "shared"),
    "deployments.ingress": (3, "ingress"),
    "deployments.replicas": (3, "replicas"),
    "deployments.http": (4, "http"),
    # The Serve config the launcher reads once, under every helper that looks at it.
    "deployments.launch.config_file": (3, "launch-config-file"),
    # What the launcher prints: below it, reads only the config.
    "deployments.launch.output": (4, "launch-output"),
    # The launcher's start-up watch (nothing of ours), below the two checks it runs.
    "deployments.launch.start_watch": (3, "launch-start-watch"),
    # The launcher's helpers below it: its instance's files (nothing of ours), what the
    # config asks of the machine, replicas that fail to start, and which apps keep an
    # ingress replica for realtime.
    "deployments.launch.paths": (4, "launch-paths"),
    "deployments.launch.placement": (4, "launch-placement"),
    "deployments.launch.failed_start": (4, "launch-failed-start"),
    "deployments.launch.realtime_front": (4, "launch-realtime-front"),
    "deployments.launch": (TOP := 5, "launch"),
}

# Inside a room, its sub-folders are ranked the same way (a folder's own files at its root
# are the prefix itself): a module may import its own sub-room or a lower one of its room.
SUB_RANKS: dict[str, dict[str, int]] = {
    "deployments.core": {
        # Shared by both processes: the protocol, priority, chunking, relevance, keys of
        # generations, the collector policy and the GIL's switch interval.
        "": 0,
        # The ingress's policies.
        "access": 1,
        "admission": 1,
        "cache": 1,
        "rollout": 1,
        "encoding": 1,
        "batch_jobs": 1,
        # The replicas' policies: memory faults and budgets under the batching that uses them,
        # and turns at a device shared across models.
        "memory": 1,
        "device_turns": 1,
        "batching": 2,
        # Every series, recorded by both sides (a cost fit is one of them).
        "metrics": 3,
    },
    "deployments.backends": {"": 0, "runtimes": 1, "generation": 1, "encoders": 2},
    "deployments.ingress": {
        # The protocol's shapes: the leaf http/ reads.
        "api": 0,
        "access": 1,
        "calls": 1,
        "rollout": 2,
        "tasks": 3,
        "cache": 4,
        # What the ingress tells of itself: health, the model list, stats (of the cache too).
        "status": 5,
        # ingress.py: the request pipeline.
        "": 6,
        # The Batch API runs its lines through the pipeline.
        "batches": 7,
    },
    "deployments.replicas": {"": 0, "batched": 1, "generation": 1},
}

# Each process's policies in core/ are its own: the other side never imports them.
INGRESS_SIDE = {"access", "admission", "cache", "rollout", "encoding", "batch_jobs"}
REPLICA_SIDE = {"memory", "batching", "device_turns"}


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
    best = max((p for p in RANKS if module == p or module.startswith(p + ".")), key=len, default="")
    return RANKS[best] if best else (TOP, module)


def sub_room(module: str) -> tuple[str, int] | None:
    """(sub-room, its rank) of a module in a room with sub-folders; None elsewhere."""
    for room, subs in SUB_RANKS.items():
        if module.startswith(room + "."):
            first = module[len(room) + 1 :].split(".")[0]
            name = first if first in subs else ""
            return name, subs[name]
    return None


def _below_in_room(dep: tuple[str, int] | None, mine: tuple[str, int] | None) -> bool | None:
    """Whether `dep`'s sub-room may be imported from `mine`'s; None where neither has one."""
    if dep is None or mine is None:
        return None
    return dep[0] == mine[0] or dep[1] < mine[1]


def core_side(module: str) -> str | None:
    if not module.startswith("deployments.core."):
        return None
    first = module.split(".")[2]
    return "ingress" if first in INGRESS_SIDE else "replicas" if first in REPLICA_SIDE else None


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
    assert "deployments.core.admission.admission" in graph["deployments.ingress.calls.model_client"]


def test_local_and_relative_imports_count(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from deployments.core import priority\n"
        "def late():\n    from . import errors\n    import deployments.http.server\n"
    )
    known = {"deployments.core.priority", "deployments.errors", "deployments.http.server"}
    assert imports_of(source, "deployments.keys", known) == known


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
            across = dep_level > level or (dep_level == level and dep_room != room)
            within = dep_room == room and _below_in_room(sub_room(dep), sub_room(name)) is False
            if across or within:
                upward.append(f"{name} -> {dep}")
    assert sorted(upward) == []


def test_each_side_keeps_to_its_own_policies() -> None:
    crossing = []
    for name, deps in import_graph().items():
        side = "ingress" if name.startswith(("deployments.ingress", "deployments.http")) else None
        if name.startswith(("deployments.replicas", "deployments.backends")):
            side = "replicas"
        mine = core_side(name) or side
        for dep in deps:
            theirs = core_side(dep)
            if mine and theirs and theirs != mine:
                crossing.append(f"{name} -> {dep}")
    assert sorted(crossing) == []


def test_every_sub_folder_is_ranked() -> None:
    for room, subs in SUB_RANKS.items():
        folder = ROOT.parent.joinpath(*room.split("."))
        found = {p.name for p in folder.iterdir() if (p / "__init__.py").exists()}
        assert found == set(subs) - {""}, room


def test_no_folder_holds_more_than_a_dozen_modules() -> None:
    crowded = {}
    for folder in [ROOT, *(p.parent for p in ROOT.rglob("__init__.py"))]:
        modules = [p for p in folder.glob("*.py") if p.name not in {"__init__.py", "__main__.py"}]
        if len(modules) > 12:
            crowded[str(folder.relative_to(ROOT.parent))] = len(modules)
    assert crowded == {}


def test_every_room_is_ranked() -> None:
    rooms = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {f"deployments.{r}" for r in rooms} <= set(RANKS)
