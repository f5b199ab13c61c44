"""The ingress deployment: parse, validate, route, answer. Logic lives in core/.

`Ingress` is a plain class built from deployment handles. Its HTTP face lives in http/:
`http.server.HttpIngress` adds the ASGI hook Serve calls, and `app.py` wraps that subclass
with `serve.ingress()`. Tests build the same subclass with fake handles.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import ray

from deployments.config import (
    AppConfig,
    EmbeddingModelConfig,
    ModelConfig,
)
from deployments.core.access.access import Tenant, estimate_tokens
from deployments.core.admission.front_shedding import FrontShedding
from deployments.core.admission.held_requests import HeldRequests
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.priority import Priority
from deployments.core.protocol import (
    BatchedHandle,
    BatchedJob,
    BatchedOutcome,
    BatchedResult,
    EmbedJob,
    EmbedResult,
    GenerationChunk,
    GenerationHandle,
    GenerationJob,
    JobTiming,
    ModelHandle,
    Rejection,
    RerankJob,
    RerankResult,
)
from deployments.core.rollout.traffic import split_pin
from deployments.core.serving_process import tune_serving_process
from deployments.errors import InvalidRequest, ModelNotFound, rejection_error
from deployments.ingress.access.gate import AccessGate
from deployments.ingress.api.dialects import Dialect
from deployments.ingress.api.request_meta import RequestMeta, choose_priority
from deployments.ingress.api.timing_headers import timing_headers
from deployments.ingress.cache.generation_cache import (
    cached_completion,
    stream_answer,
    whole_answer,
)
from deployments.ingress.cache.item_cache import ItemCaches, cached_run, with_cached_inputs
from deployments.ingress.calls.generation_call import GenerationCall
from deployments.ingress.calls.model_client import ModelClient, overloaded
from deployments.ingress.calls.observe import (
    RequestObserver,
    note_request,
    observed,
    request_started,
)
from deployments.ingress.rollout.catalog import AppHandle, Catalog
from deployments.ingress.rollout.versions import Version
from deployments.ingress.status.health import Health, ReadinessCheck
from deployments.ingress.status.model_list import model_list
from deployments.ingress.status.stats_gather import Stats
from deployments.ingress.tasks.embed import (
    embedding_token_estimate,
    find_model,
    parse_embed_call,
    refuse_wider_than_model,
)
from deployments.ingress.tasks.generation import (
    LiveGeneration,
    Reply,
    build_job,
    parse_generation_request,
    run_whole,
    timeout_for,
)
from deployments.ingress.tasks.rerank import (
    parse_rerank_request,
    rerank_job,
    rerank_response,
    rerank_token_estimate,
)
from deployments.ingress.tasks.shadow import (
    SHADOW_TIMEOUT_S,
    ShadowCopies,
    compare_embeddings,
    compare_rerank,
)
from deployments.metrics import build_metrics

JobT = TypeVar("JobT", EmbedJob, RerankJob)


@dataclass
class Answer:
    body: Any  # a JSON object, or a list for TEI's rerank
    headers: dict[str, str]
    events: AsyncIterator[bytes] | None = None  # server-sent events instead of `body`


class Ingress:
    def __init__(
        self,
        config: dict[str, Any],
        *,
        # Per task, `name@version` (or the name alone) -> DeploymentHandle of its replica.
        embedders: Mapping[str, BatchedHandle[BatchedJob, BatchedOutcome]] | None = None,
        rerankers: Mapping[str, BatchedHandle[BatchedJob, BatchedOutcome]] | None = None,
        generators: Mapping[str, GenerationHandle] | None = None,
        readiness: ReadinessCheck | None = None,
        metrics: TributaryMetrics | None = None,  # None: Ray's, inside a Ray worker
        app_handle: AppHandle | None = None,  # None: Serve's, by app name
    ) -> None:
        self.config = AppConfig.model_validate(config)
        self.observer = RequestObserver(metrics or build_metrics())
        self.shadows = ShadowCopies(self.observer.metrics)
        self.catalog = Catalog(
            self.config,
            {
                "embedding": embedders or {},
                "rerank": rerankers or {},
                "generation": generators or {},
            },
            app_handle or _serve_app_handle,
            self.observer.metrics,
        )
        self._created = int(time.time())
        self.gate = AccessGate(self.config.auth)
        self.cache = ItemCaches(self.config.cache, self.observer.metrics)
        self.held = HeldRequests(self.config.ingress.admission.max_held_requests)
        headroom = self.config.ingress.admission.front_door_headroom
        # The share HAProxy refuses before a request reaches Python (http/front_shedding.py).
        self.front_shedding = None if headroom is None else FrontShedding(headroom)
        self.health = Health(self.catalog, readiness)
        self.stats = Stats(
            self.catalog,
            self.observer,
            self.shadows,
            self.cache,
            self.gate,
            self.held,
            self.front_shedding,
        )
        self.gate.warn_if_open_to_the_network()
        self._tasks = {"embedding": self.embed, "rerank": self.rerank, "generation": self.generate}
        if metrics is None and ray.is_initialized():  # in a replica, not a test's process
            tune_serving_process("ingress")

    async def reconfigure(self, user_config: dict[str, Any] | None) -> None:
        """The traffic policy (config/traffic.py): Serve calls this at start and on every
        `serve deploy` that changes it, with no restart."""
        self.catalog.apply(user_config)
        for name, table in self.catalog.tables.items():
            for version, share in table.shares().items():
                self.observer.metrics.traffic_weight(name, version, share)

    def list_models(self) -> dict[str, Any]:
        return model_list(self.catalog, self._created)

    def _route(
        self, asked: str | None, meta: RequestMeta, tenant: Tenant | None, user: str | None
    ) -> tuple[str | None, Callable[[str], Version]]:
        """The name a request asked for (without its `@version`), and how to pick its
        version once the name is known to exist."""
        name, pin = (None, None) if asked is None else split_pin(asked)
        self.catalog.refuse_if_starting(name)
        if meta.version is not None:
            if pin is not None and pin != meta.version:
                raise InvalidRequest(
                    f"The model names version '{pin}' and X-Model-Version says '{meta.version}'.",
                    param="model",
                )
            pin = meta.version
        keys = {"session": meta.session, "user": user, "api_key": meta.authorization}
        return name, lambda found: self.catalog.table(found).choose(pin, keys)

    async def answer(
        self, dialect: Dialect, body: bytes, meta: RequestMeta, tenant: Tenant | None
    ) -> Answer:
        """A model request in any dialect (ingress/api/dialects.py): the one entry of the
        HTTP routes and of the Batch API's lines."""
        return await self._tasks[dialect.task](body, meta, tenant, dialect)

    @observed
    async def embed(
        self, body: bytes, meta: RequestMeta, tenant: Tenant | None, dialect: Dialect
    ) -> Answer:
        """/v1/embeddings, Cohere's /v1/embed and /v2/embed, TEI's /embed (tasks/embed.py)."""
        call = parse_embed_call(body, dialect)
        name, pick = self._route(call.model, meta, tenant, call.user)
        model = find_model(self.catalog.of_task("embedding"), name)
        version = pick(model.name)
        priority = self._admit(model, version, call.priority, meta, tenant)
        job = call.job(model, meta.request_id)
        await refuse_wider_than_model(call, version.client)
        outcome, hits = await self._run_cached(
            version, priority, job, embedding_token_estimate, meta, tenant
        )
        assert isinstance(outcome, EmbedResult)  # an embedding replica answers vectors
        body = with_cached_inputs(call.respond(outcome, model.name), hits)
        return Answer(body, _headers(priority, version) | _timing(outcome.timing))

    async def embedding_model_info(self) -> tuple[EmbeddingModelConfig, dict[str, Any]]:
        """The first embedding model and what its replica says of itself (TEI's /info)."""
        model = find_model(self.catalog.of_task("embedding"), None)
        client = self.catalog.table(model.name).choose(None, {}).client
        assert client is not None
        return model, await client.info()

    @observed
    async def rerank(
        self, body: bytes, meta: RequestMeta, tenant: Tenant | None, dialect: Dialect
    ) -> Answer:
        """Cohere's /v1/rerank, Jina's /v2/rerank, TEI's /rerank (tasks/rerank.py)."""
        query = parse_rerank_request(body, dialect)
        models = self.catalog.of_task("rerank")
        asked, pick = self._route(query.model, meta, tenant, None)
        name = asked if asked is not None else next(iter(models), None)  # TEI names none
        model = models.get(name or "")
        if name is None:
            raise ModelNotFound("This server has no rerank model.", param="model")
        if model is None:
            raise ModelNotFound(
                f"The rerank model '{name}' does not exist; GET /v1/models lists them "
                "(task: rerank).",
                param="model",
            )
        version = pick(model.name)
        priority = self._admit(model, version, query.priority, meta, tenant)
        job = rerank_job(query, model, meta.request_id)
        outcome, hits = await self._run_cached(
            version, priority, job, rerank_token_estimate, meta, tenant
        )
        assert isinstance(outcome, RerankResult)  # a rerank replica answers scores
        answer = with_cached_inputs(rerank_response(query, model.name, outcome), hits)
        return Answer(answer, _headers(priority, version) | _timing(outcome.timing))

    @observed
    async def generate(
        self, body: bytes, meta: RequestMeta, tenant: Tenant | None, dialect: Dialect
    ) -> Answer:
        """/v1/chat/completions and /v1/completions (ingress/tasks/generation.py)."""
        request = parse_generation_request(body, dialect)
        name, pick = self._route(request.model, meta, tenant, request.user)
        model = self.catalog.of_task("generation").get(name or "")
        if model is None:
            raise ModelNotFound(
                f"The generation model '{name}' does not exist; GET /v1/models "
                "lists them (task: generation).",
                param="model",
            )
        version = pick(model.name)
        priority = self._admit(model, version, request.priority, meta, tenant)
        note_request(priority=priority.label, items=1)
        job = build_job(request, model, meta.request_id)
        reply = Reply(dialect, model.name)
        headers = _headers(priority, version)
        cached = cached_completion(self.cache, version.serving, job, tenant, priority.label)

        async def start() -> LiveGeneration:
            return await self._start_generation(version, priority, job, meta, tenant)

        if request.stream:
            events = await stream_answer(cached, reply, request.include_usage, start)
            return Answer(None, headers, events=events)

        async def complete() -> tuple[str, GenerationChunk]:
            live, text, last = await run_whole(start)
            live.settle(last)
            took = time.monotonic() - live.started
            self.shadows.send_generation(live.table, version, job, text, took)
            return text, last

        return Answer(await whole_answer(cached, reply, complete), headers)

    async def _start_generation(
        self,
        version: Version,
        priority: Priority,
        job: GenerationJob,
        meta: RequestMeta,
        tenant: Tenant | None,
    ) -> LiveGeneration:
        """Charges the tenant an estimate and starts the call to the version's replica:
        its first chunk is in, or the refusal raised (and the charge refunded)."""
        name = version.serving.name
        texts = job.prompt or " ".join(m["content"] for m in job.messages or [])
        estimate = estimate_tokens([texts]) + job.max_tokens
        charge = self.gate.hold(tenant, estimate)
        timeout_s = timeout_for(self.config.ingress.admission, priority, meta.timeout_s)
        assert version.watch is not None
        call = GenerationCall(name, version.handle, priority, timeout_s, version.watch)
        table = self.catalog.table(name)
        live = LiveGeneration(call, charge, table, version, self.observer.metrics)
        await live.start(job)
        return live

    def _admit(
        self,
        model: ModelConfig,
        version: Version,
        body_priority: str | None,
        meta: RequestMeta,
        tenant: Tenant | None,
    ) -> Priority:
        """Labels the request with its model, checks the tenant may use that model, and
        returns its class: the one asked for (header or body), capped at the tenant's tier."""
        note_request(model=model.name, version=version.label)
        self.gate.authorize(tenant, model.name)
        asked = choose_priority(meta.priority, body_priority)
        return asked if tenant is None else asked.capped_at(tenant.tier)

    async def _run_cached(
        self,
        version: Version,
        priority: Priority,
        job: JobT,
        estimate: Callable[[JobT], int],
        meta: RequestMeta,
        tenant: Tenant | None,
    ) -> tuple[BatchedResult, int | None]:
        """The job through the result cache (ingress/cache/item_cache.py): only its misses run,
        keyed by the version that serves them; also how many inputs hit."""
        name = version.serving.name
        return await cached_run(
            self.cache,
            version.serving,
            job,
            tenant,
            priority.label,
            lambda misses: self._run(
                name, version, priority, misses, estimate(misses), meta, tenant
            ),
        )

    async def _run(
        self,
        model: str,
        version: Version,
        priority: Priority,
        job: BatchedJob,
        estimate: int,
        meta: RequestMeta,
        tenant: Tenant | None,
    ) -> BatchedResult:
        """Charge the tenant, queue the job, wait for its outcome; the tenant pays for the
        tokens the model counted, none for a job that failed. Then, maybe, a shadow copy."""
        note_request(priority=priority.label, items=len(job))
        refusal = self.held.check(priority)
        if refusal is not None:
            raise overloaded(model, priority, refusal)
        charge = self.gate.hold(tenant, estimate)
        admission = self.config.ingress.admission.of(priority.label)
        timeout_s = meta.timeout_s if meta.timeout_s is not None else admission.timeout_s
        table = self.catalog.table(model)
        started = time.monotonic()
        with (
            self.held.holding(),
            charge.refunded_on_failure(),
            table.judged(version, self.observer.metrics, started),
        ):
            outcome = await _client_of(version).submit(priority, job, timeout_s)
            if isinstance(outcome, Rejection):
                raise rejection_error(outcome)
        charge.settle(sum(outcome.token_counts))

        async def run(target: Version) -> BatchedOutcome:
            copy = dataclasses.replace(job, job_id=uuid.uuid4().hex)
            return await _client_of(target).submit(Priority.BATCH, copy, SHADOW_TIMEOUT_S)

        compare = compare_embeddings if isinstance(job, EmbedJob) else compare_rerank
        self.shadows.maybe_send(table, version, outcome, time.monotonic() - started, run, compare)
        return outcome


def _client_of(version: Version) -> ModelClient[BatchedJob, BatchedOutcome]:
    assert version.client is not None  # embed and rerank versions always have one
    return version.client


def _serve_app_handle(app: str) -> ModelHandle:
    from ray import serve

    return serve.get_app_handle(app)


def _headers(priority: Priority, version: Version) -> dict[str, str]:
    return {"X-Priority": priority.label, "X-Model-Version": version.label}


def _timing(timing: JobTiming | None) -> dict[str, str]:
    """Where the request's time went (api/timing_headers.py), from its arrival here."""
    started = request_started()
    total_s = 0.0 if started is None else time.monotonic() - started
    return timing_headers(total_s, timing)
