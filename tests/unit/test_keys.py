import hashlib

import pytest

from deployments.core.access import keys
from deployments.core.access.keys import KEY_PREFIX, KeyRing, digest, new_key


def test_digest_is_the_sha256_hex_of_the_key() -> None:
    assert digest("secret") == hashlib.sha256(b"secret").hexdigest()
    assert len(digest("secret")) == 64


def test_new_keys_carry_the_prefix_and_differ() -> None:
    made = {new_key() for _ in range(20)}
    assert len(made) == 20
    assert all(k.startswith(KEY_PREFIX) and len(k) > len(KEY_PREFIX) + 32 for k in made)


def test_owner_of_finds_the_owner_of_a_stored_digest() -> None:
    alice, bob = new_key(), new_key()
    ring = KeyRing([(digest(alice), "alice"), (digest(bob), "bob")])
    assert ring.owner_of(alice) == "alice"
    assert ring.owner_of(bob) == "bob"


@pytest.mark.parametrize("presented", ["", "wrong", "trib-nope", "secret ", "SECRET"])
def test_a_key_that_matches_no_digest_has_no_owner(presented: str) -> None:
    ring = KeyRing([(digest("secret"), "tenant")])
    assert ring.owner_of(presented) is None


def test_the_ring_holds_digests_not_keys() -> None:
    key = new_key()
    ring = KeyRing([(digest(key), "tenant")])
    assert key not in repr(vars(ring))
    # Configuring the clear key in place of its digest must not let that key in.
    careless = KeyRing([(key, "tenant")])
    assert careless.owner_of(key) is None
    # A presented digest is hashed again, so a leaked digest is no key either.
    assert ring.owner_of(digest(key)) is None


def test_stored_digests_match_whatever_their_case() -> None:
    ring = KeyRing([(digest("secret").upper(), "tenant")])
    assert ring.owner_of("secret") == "tenant"


def test_every_entry_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[str, str]] = []

    def spy(a: str, b: str) -> bool:
        compared.append((a, b))
        return a == b

    monkeypatch.setattr(keys.hmac, "compare_digest", spy)
    ring = KeyRing([(digest(k), k) for k in ("k1", "k2", "k3")])
    assert ring.owner_of("k1") == "k1"  # found first, yet the others are still compared
    assert [b for _, b in compared] == [digest("k1"), digest("k2"), digest("k3")]
    assert all(a == digest("k1") for a, _ in compared)


def test_an_empty_ring_is_falsy_and_knows_no_one() -> None:
    ring: KeyRing[str] = KeyRing([])
    assert not ring
    assert ring.owner_of("anything") is None
    assert KeyRing([(digest("k"), "t")])
