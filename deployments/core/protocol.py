"""What crosses Ray between the ingress and the model replicas: jobs, outcomes, and the one
`Rejection` every task answers with. Plain data, so the ingress builds it without model code.

Embed and rerank: one job is one HTTP request; the ingress sends the jobs of one priority
class (its concurrent requests) in a single call, with the seconds each has left before its
deadline and the seconds each has already spent at the ingress (a latency target is judged
from the request's arrival there), and gets back one outcome per job, in order. A job that
cannot be served (too long, bad token ids, out of time) gets a `Rejection` without failing the
other jobs of its call. Generation: one job per call; chunks stream back, or a `Rejection`
instead of any.

The batched replicas' methods are typed here too, on both sides: `BatchedModel` is what an
embedder or reranker deployment class defines (app.py checks it), `BatchedHandle` what the
ingress calls through Serve's handle to it. The one per-task entry is the deployment's
`__call__`, reached as `handle.remote(call)` with a `JobCall`: no method name travels.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Generator
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, ParamSpec, Protocol, TypeVar

import numpy as np

from deployments.core.priority import Priority


@dataclass(frozen=True)
class EmbedJob:
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    job_id: str = ""  # unique per job; how the ingress names a job it no longer wants
    request_id: str = ""  # the client's X-Request-ID, for logs and the drop ledger
    # An input over the window: None follows the model's `truncate`; "end" or "start" cuts
    # that end; "refuse" answers 400 (Cohere's truncate, TEI's truncate and direction).
    truncate: Literal["end", "start", "refuse"] | None = None
    # Names of a sentence-transformers prompt of the model, the first it has prepended to
    # every text (TEI's prompt_name, Cohere's input_type); with `prompt_optional`, a model
    # with none of them embeds the texts as they are, else the job gets a 400.
    prompt_names: tuple[str, ...] = ()
    prompt_optional: bool = False
    normalize: bool = True  # False: the model's own output (TEI's normalize)

    def __post_init__(self) -> None:
        if (self.texts is None) == (self.token_ids is None):
            raise ValueError("an EmbedJob has either texts or token_ids")

    def __len__(self) -> int:
        inputs = self.texts if self.texts is not None else self.token_ids
        return len(inputs or ())


@dataclass(frozen=True)
class JobTiming:
    """Where a job's time went in its replica, for the answer's timing headers
    (ingress/api/timing_headers.py): its share of its call's tokenising, the wait from its
    request's arrival at the ingress to its first forward pass, and the forward passes that
    computed its inputs."""

    tokenize_s: float
    queue_s: float
    inference_s: float


@dataclass(frozen=True)
class EmbedResult:
    vectors: np.ndarray  # (inputs, dim) float32, unit length unless the job said otherwise
    token_counts: list[int]  # tokens fed to the model per input, special tokens included
    truncated: list[int] = field(default_factory=list)  # indices of inputs that were cut
    timing: JobTiming | None = None  # None where no replica computed it (the cache's)


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


# Rerank.


@dataclass(frozen=True)
class RerankJob:
    query: str
    documents: list[str]
    # Tokens of each document that are scored (None: the model's configured cap).
    max_tokens_per_doc: int | None = None
    # Score only each document's first window, as a plain truncating reranker does.
    first_chunk_only: bool = False
    job_id: str = ""
    request_id: str = ""
    # The ingress's estimate of the query-chunk pairs the model will score.
    chunk_passes: int = 0
    # The request field holding the documents, for errors: "documents", or TEI's "texts".
    documents_param: str = "documents"

    def __len__(self) -> int:
        # Admission counts what the model will score, chunk passes: one long document is
        # many of them. Every document is at least one, whatever the estimate says.
        return max(self.chunk_passes, len(self.documents))


@dataclass(frozen=True)
class RerankResult:
    raw: np.ndarray  # per document: the model's raw score (logit or cosine) of its best chunk
    relevance: np.ndarray  # per document: the same mapped into [0, 1]
    token_counts: list[int]  # per document: tokens fed to the model over all its chunks
    chunks: list[int]  # per document: how many chunks were scored
    truncated: list[int] = field(default_factory=list)  # documents cut at max_tokens_per_doc
    timing: JobTiming | None = None  # None where no replica computed it (the cache's)


RerankOutcome = RerankResult | Rejection


# Generation.

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class GenerationJob:
    request_id: str
    max_tokens: int
    prompt: str | None = None  # /v1/completions
    messages: list[dict[str, str]] | None = None  # /v1/chat/completions
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    # The client takes the answer whole (no `stream`): after the first chunk, the replica
    # sends the rest as one, at the end. Each chunk is an object through Ray on both sides;
    # one a token cost the ingress and the replica more CPU than the tiny model's steps.
    whole: bool = False


@dataclass(frozen=True)
class GenerationChunk:
    """New text since the last chunk. The last chunk has `finish_reason` set; every chunk
    carries the counts so far, so the last one is the request's usage."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: FinishReason | None = None


# The batched replicas' calls.

# What an embed or rerank replica's queues carry, and what comes back for each job.
BatchedJob = EmbedJob | RerankJob
BatchedResult = EmbedResult | RerankResult
BatchedOutcome = EmbedOutcome | RerankOutcome

JobT = TypeVar("JobT")
OutcomeT = TypeVar("OutcomeT")
ResultT_co = TypeVar("ResultT_co", covariant=True)
Params = ParamSpec("Params")


class BatchJob(Protocol):
    """What both sides read of a job of any batched task (EmbedJob, RerankJob)."""

    @property
    def job_id(self) -> str: ...

    @property
    def request_id(self) -> str: ...

    def __len__(self) -> int: ...  # the items it weighs in a queue


@dataclass(frozen=True)
class JobCall(Generic[JobT]):
    """One call from the ingress to a batched replica: jobs of one priority class, and per
    job the seconds left before its deadline (None: no deadline) and the seconds it has
    already spent at the ingress. The replica answers one outcome per job, in order.
    `target_s`: the class's latency target that the ingress admits by (None: none), and
    `shedding`: whether the ingress refused requests of the class within the last second,
    so the replica can tell whether the class has time to spare."""

    priority: Priority
    jobs: list[JobT]
    time_left_s: list[float | None]
    spent_s: list[float]
    target_s: float | None = None
    shedding: bool = False


class BatchedModel(Protocol[JobT, OutcomeT]):
    """The methods of a batched replica's deployment class that the ingress calls."""

    async def __call__(self, call: JobCall[JobT]) -> list[OutcomeT]: ...

    def forget(self, job_ids: list[str]) -> int:
        """Jobs whose client went away: dropped before the model computes them; returns
        how many this replica still held."""
        ...

    def info(self) -> dict[str, Any]: ...  # the replica's figures for /v1/stats

    def model_config(self) -> dict[str, Any]: ...  # what a version's own app serves


class ReplicaResponse(Protocol[ResultT_co]):
    """Serve's DeploymentResponse as the ingress uses it: awaited, or cancelled."""

    def __await__(self) -> Generator[Any, None, ResultT_co]: ...

    def cancel(self) -> None: ...


class RemoteMethod(Protocol[Params, ResultT_co]):
    """One method on Serve's handle: `handle.<method>.remote(...)`."""

    def remote(
        self, *args: Params.args, **kwargs: Params.kwargs
    ) -> ReplicaResponse[ResultT_co]: ...


class BatchedHandle(Protocol[JobT, OutcomeT]):
    """Serve's DeploymentHandle to a batched replica, typed as `BatchedModel`'s methods: a
    plain `remote` calls the deployment's `__call__`."""

    def remote(self, call: JobCall[JobT]) -> ReplicaResponse[list[OutcomeT]]: ...

    @property
    def forget(self) -> RemoteMethod[[list[str]], int]: ...

    @property
    def info(self) -> RemoteMethod[[], dict[str, Any]]: ...

    @property
    def model_config(self) -> RemoteMethod[[], dict[str, Any]]: ...


class ReplicaStream(Protocol[ResultT_co]):
    """Serve's DeploymentResponseGenerator as the ingress uses it: read, or cancelled."""

    def __anext__(self) -> Awaitable[ResultT_co]: ...

    def __aiter__(self) -> AsyncIterator[ResultT_co]: ...

    def cancel(self) -> None: ...


class StreamingMethod(Protocol[Params, ResultT_co]):
    """One method on a streaming handle: `handle.options(stream=True).<method>.remote(...)`."""

    def remote(self, *args: Params.args, **kwargs: Params.kwargs) -> ReplicaStream[ResultT_co]: ...


class GenerationStreams(Protocol):
    @property
    def generate(
        self,
    ) -> StreamingMethod[[str, GenerationJob, float], GenerationChunk | Rejection]: ...


class GenerationHandle(Protocol):
    """Serve's DeploymentHandle to a generation replica, typed as the ingress calls it."""

    def options(self, *, stream: bool) -> GenerationStreams: ...

    @property
    def info(self) -> RemoteMethod[[], dict[str, Any]]: ...

    @property
    def engine_alive(self) -> RemoteMethod[[str], bool]: ...  # a probe key, for routing

    @property
    def model_config(self) -> RemoteMethod[[], dict[str, Any]]: ...


# A handle to any model replica, as the ingress holds it before it knows the task.
ModelHandle = BatchedHandle[BatchedJob, BatchedOutcome] | GenerationHandle
