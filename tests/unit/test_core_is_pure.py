"""core/ must stay free of Ray and HTTP so it can be tested and reused without them."""

import ast
from pathlib import Path

import deployments.core

FORBIDDEN = {"ray", "fastapi", "starlette", "uvicorn", "httpx", "aiohttp", "torch"}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_imports_neither_ray_nor_http_nor_torch() -> None:
    core_dir = Path(deployments.core.__file__).parent
    files = sorted(core_dir.rglob("*.py"))
    assert len(files) > 3
    offenders = {f.name: imported_roots(f) & FORBIDDEN for f in files}
    assert {name: bad for name, bad in offenders.items() if bad} == {}
