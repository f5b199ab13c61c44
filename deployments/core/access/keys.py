"""API keys: stored as SHA-256 digests, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from typing import Generic, TypeVar

Owner = TypeVar("Owner")

KEY_PREFIX = "trib-"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyRing(Generic[Owner]):
    def __init__(self, entries: Iterable[tuple[str, Owner]]) -> None:
        """`entries`: (SHA-256 hex digest of a key, its owner)."""
        self._entries = [(d.lower(), owner) for d, owner in entries]

    def __bool__(self) -> bool:
        return bool(self._entries)

    def owners(self) -> list[Owner]:
        return [owner for _, owner in self._entries]

    def owner_of(self, key: str) -> Owner | None:
        presented = digest(key)
        found: Owner | None = None
        # Every entry is compared, and compare_digest takes the same time whether or not
        # the digests differ early, so timing says nothing about which key came close.
        for stored, owner in self._entries:
            if hmac.compare_digest(presented, stored):
                found = owner
        return found
