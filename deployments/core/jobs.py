"""Messages between the ingress and an embedding deployment.

One `EmbedJob` is one HTTP request's inputs; the ingress sends a list of jobs (one per
concurrent request of one priority class) in a single call, with the seconds each has left
before its deadline, and gets back one outcome per job, in order. A job that cannot be
served (too long, bad token ids, out of time) gets an `Rejection` without failing the
other jobs of its call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class EmbedJob:
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    job_id: str = ""  # unique per job; how the ingress names a job it no longer wants
    request_id: str = ""  # the client's X-Request-ID, for logs and the drop ledger

    def __post_init__(self) -> None:
        if (self.texts is None) == (self.token_ids is None):
            raise ValueError("an EmbedJob has either texts or token_ids")

    def __len__(self) -> int:
        inputs = self.texts if self.texts is not None else self.token_ids
        return len(inputs or ())


@dataclass(frozen=True)
class EmbedResult:
    vectors: np.ndarray  # (inputs, dim) float32, unit length
    token_counts: list[int]  # tokens fed to the model per input, special tokens included
    truncated: list[int] = field(default_factory=list)  # indices of inputs that were cut


@dataclass(frozen=True)
class Rejection:
    """A job a model deployment refused, of any task; `status` is the HTTP status to answer.
    A generation replica sends it instead of any chunk."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    retry_after_s: float | None = None  # with 429 and 503


EmbedOutcome = EmbedResult | Rejection

DEADLINE_MESSAGE = "The request's deadline passed before the model reached it."


def deadline_rejection() -> Rejection:
    return Rejection(504, DEADLINE_MESSAGE, code="deadline_exceeded")
