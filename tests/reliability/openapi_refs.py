"""Every `$ref` of an OpenAPI document must point at something in it: a dangling one makes
fuzzers and client generators give up on the operation that holds it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def resolves(document: dict[str, Any], ref: str) -> bool:
    if not ref.startswith("#/"):
        return False  # the app's document is self-contained
    node: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def dangling_refs(document: dict[str, Any]) -> list[str]:
    return sorted({ref for ref in refs(document) if not resolves(document, ref)})
