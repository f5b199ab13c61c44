"""Turn a growing list of generated tokens into text deltas, and apply stop sequences.

Decoding token by token can split a character (byte-level tokenizers) or change earlier
text (tokenizers that merge spaces), so the whole generation is decoded each time and
only what is new goes out. Text that could be the start of a stop sequence is held back
until it is clear either way, so a stop sequence never reaches the client.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Delta:
    text: str
    stopped: bool  # a stop sequence was found; `text` ends right before it


class TextStream:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._sent = 0  # characters of the decoded text already sent

    def update(self, tokens: Sequence[int], final: bool) -> Delta:
        text = self._decode(tokens)
        hits = [i for s in self._stop if (i := text.find(s, max(0, self._sent - self._hold))) >= 0]
        if hits:
            end = min(hits)
            return Delta(self._take(text, end), True)
        if final:
            return Delta(self._take(text, len(text)), False)
        end = len(text) - self._hold
        if text.endswith("\ufffd"):  # half a character: wait for the rest of it
            end = min(end, len(text) - 1)
        return Delta(self._take(text, end), False)

    def _take(self, text: str, end: int) -> str:
        if end <= self._sent:
            return ""
        piece = text[self._sent : end]
        self._sent = end
        return piece
