"""Which version of a model serves a request: weights, sticky assignment, pinning.

Pure: the ingress passes in the weights it has (those of versions it cannot reach, or that
a guard has stopped, already at 0) and whatever identifies the caller. A caller with a key
(session, user or API key) is hashed onto [0, 1) with the model's name, so it lands on the
same version for as long as the weights stand; a caller without one is drawn at random.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence

PIN_SEPARATOR = "@"


def split_pin(model: str) -> tuple[str, str | None]:
    """`name@version` -> (name, version); a plain name -> (name, None)."""
    name, separator, version = model.rpartition(PIN_SEPARATOR)
    if not separator or not name or not version:
        return model, None
    return name, version


def sticky_point(model: str, key: str) -> float:
    """Where a caller falls on [0, 1) for one model: the same key, the same point."""
    digest = hashlib.sha256(f"{model}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def choose_version(
    model: str,
    weights: Sequence[tuple[str, float]],
    sticky_key: str | None,
    rng: random.Random | None = None,
) -> str:
    """The version for one request. `weights` in a fixed order (the config's), each >= 0;
    when every weight is 0 the first version serves."""
    if not weights:
        raise ValueError(f"model {model!r} has no versions")
    total = sum(weight for _, weight in weights)
    if total <= 0:
        return weights[0][0]
    # A caller with a key always falls at the same point; one without is drawn anew.
    point = sticky_point(model, sticky_key) if sticky_key else (rng or random).random()
    reached = 0.0
    for version, weight in weights:
        reached += weight / total
        if point < reached:
            return version
    # Rounding can leave the sum a hair under 1: the last version with weight serves.
    return next(version for version, weight in reversed(weights) if weight > 0)


def first_key(candidates: Mapping[str, str | None], order: Sequence[str]) -> str | None:
    """The first of the caller's keys, in the policy's order, that the request has; the
    kind is part of the key so a session id never collides with an API key."""
    for kind in order:
        value = candidates.get(kind)
        if value:
            return f"{kind}:{value}"
    return None
