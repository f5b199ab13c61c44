"""Fit token ids into a model's window the way the model's own tokenizer would."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TokenWindow:
    """The special tokens a tokenizer puts around a text, and the model's length limit."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    max_tokens: int

    @property
    def max_body(self) -> int:
        return self.max_tokens - len(self.prefix) - len(self.suffix)

    def full_length(self, body: list[int]) -> int:
        return len(self.prefix) + len(body) + len(self.suffix)

    def wrap(self, body: list[int], keep_end: bool = False) -> tuple[list[int], bool]:
        """The model input for `body` (ids without special tokens) and whether it was cut;
        `keep_end` cuts the start instead of the end."""
        cut = len(body) > self.max_body
        if cut:
            body = body[len(body) - self.max_body :] if keep_end else body[: self.max_body]
        return [*self.prefix, *body, *self.suffix], cut
