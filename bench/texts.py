"""Deterministic corpus of short English sentences for benchmarks."""

import random

_DETERMINERS = ("the", "a", "every", "one", "that", "some")
_ADJECTIVES = (
    "quiet",
    "bright",
    "old",
    "small",
    "busy",
    "green",
    "heavy",
    "quick",
    "distant",
    "careful",
    "warm",
    "broken",
    "silver",
    "gentle",
    "narrow",
    "tired",
)
_NOUNS = (
    "river",
    "engineer",
    "garden",
    "train",
    "teacher",
    "window",
    "market",
    "dog",
    "city",
    "mountain",
    "library",
    "student",
    "bridge",
    "kitchen",
    "farmer",
    "ship",
    "forest",
    "doctor",
    "letter",
    "village",
    "storm",
    "painter",
    "road",
    "cat",
)
_VERBS = (
    "watches",
    "builds",
    "follows",
    "finds",
    "carries",
    "paints",
    "crosses",
    "opens",
    "remembers",
    "visits",
    "repairs",
    "describes",
    "hears",
    "leaves",
    "measures",
)
_PREPOSITIONS = (
    "near",
    "under",
    "behind",
    "across",
    "beside",
    "through",
    "above",
    "after",
)
_ADVERBS = (
    "slowly",
    "again",
    "today",
    "quietly",
    "often",
    "early",
    "suddenly",
    "carefully",
)

_MIN_WORDS = 6
_MAX_WORDS = 16
_P_EXTRA_PHRASE = 0.6
_P_ADVERB = 0.5


def _noun_phrase(rng: random.Random) -> list[str]:
    words = [rng.choice(_DETERMINERS)]
    words += rng.sample(_ADJECTIVES, rng.randint(0, 2))
    words.append(rng.choice(_NOUNS))
    return words


def _sentence(rng: random.Random) -> str:
    words = [*_noun_phrase(rng), rng.choice(_VERBS), *_noun_phrase(rng)]
    # Grow with whole phrases only, so no sentence is cut off mid-phrase.
    while len(words) < _MIN_WORDS or rng.random() < _P_EXTRA_PHRASE:
        phrase = [rng.choice(_PREPOSITIONS), *_noun_phrase(rng)]
        if len(words) + len(phrase) > _MAX_WORDS:
            break
        words += phrase
    if len(words) < _MAX_WORDS and rng.random() < _P_ADVERB:
        words.append(rng.choice(_ADVERBS))
    return " ".join(words).capitalize() + "."


def sentences(n: int = 2000, seed: int = 0) -> list[str]:
    """Return ``n`` distinct sentences of 6-16 words, identical for a given seed."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        s = _sentence(rng)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out
