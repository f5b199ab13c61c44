"""The ingress deployment: parse, validate, route, answer. Logic lives in core/.

`Ingress` is a plain class built from deployment handles. Its HTTP face lives in http/:
`http.server.HttpIngress` adds the ASGI hook Serve calls, and `app.py` wraps that subclass
with `serve.ingress()`. Tests build the same subclass with fake handles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from deployments.config import (
    AppConfig,
    EmbeddingModelConfig,
    GenerationModelConfig,
    RerankModelConfig,
)
from deployments.core.access import AccessDenied, Tenant, estimate_tokens
from deployments.core.class_queues import Refused, loop_deadline
from deployments.core.coalescer import DeadlineExpired
from deployments.core.metrics import TributaryMetrics
from deployments.core.priority import Priority
from deployments.core.protocol import GenerationChunk, Rejection
from deployments.errors import (
    DeadlineExceeded,
    Forbidden,
    ModelNotFound,
    NotReady,
    Overloaded,
    RateLimited,
    TributaryError,
    Unauthorized,
    rejection_error,
)
from deployments.ingress.embed_dialects import EmbedDialect, find_model, parse_embed_call
from deployments.ingress.embeddings import embedding_token_estimate
from deployments.ingress.generation import (
    GenerationCall,
    Reply,
    build_job,
    collect,
    sse,
    timeout_for,
)
from deployments.ingress.generation_schemas import parse_generation_request
from deployments.ingress.item_cache import ItemCaches, cached_run, with_cached_inputs
from deployments.ingress.model_client import ModelClient
from deployments.ingress.observe import RequestObserver, note_request, observed
from deployments.ingress.readiness import engines_problem, serve_readiness
from deployments.ingress.replica_watch import ReplicaWatch
from deployments.ingress.request_meta import RequestMeta, choose_priority, read_meta
from deployments.ingress.rerank import rerank_job, rerank_response, rerank_token_estimate
from deployments.ingress.rerank_schemas import Dialect, parse_rerank_request
from deployments.ingress.stats_view import batching_classes, generation_classes
from deployments.ingress.tenants import build_access_control
from deployments.metrics import build_metrics

T = TypeVar("T")

logger = logging.getLogger("ray.serve")


ReadinessCheck = Callable[[], Awaitable[str | None]]


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
        # Per task, model name -> DeploymentHandle of its replica; one per configured model.
        embedders: dict[str, Any] | None = None,
        rerankers: dict[str, Any] | None = None,
        generators: dict[str, Any] | None = None,
        readiness: ReadinessCheck | None = None,
        metrics: TributaryMetrics | None = None,  # None: Ray's, inside a Ray worker
    ) -> None:
        self.config = AppConfig.model_validate(config)
        self.observer = RequestObserver(metrics or build_metrics())
        self._models: dict[str, EmbeddingModelConfig] = {
            m.name: m for m in self.config.embedding_models
        }
        self._rerank_models: dict[str, RerankModelConfig] = {
            m.name: m for m in self.config.rerank_models
        }
        self._generation_models: dict[str, GenerationModelConfig] = {
            m.name: m for m in self.config.generation_models
        }
        self._generators = generators or {}
        self._watches = {
            name: ReplicaWatch(name, _alive_probe(handle))
            for name, handle in self._generators.items()
        }
        self._created = int(time.time())
        self._readiness = readiness or serve_readiness
        self.access = build_access_control(self.config.auth)
        ingress = self.config.ingress
        self._clients = {
            name: ModelClient(
                name, (embedders or {})[name], ingress.admission, ingress.max_group_items
            )
            for name in self._models
        }
        for name in self._rerank_models:
            self._clients[name] = ModelClient(
                name,
                (rerankers or {})[name],
                ingress.admission,
                ingress.max_group_items,
                method="rerank_jobs",
            )
        self._denied: dict[str, int] = {}
        self.cache = ItemCaches(self.config.cache, self._clients, self.observer.metrics)
        if self.access.is_open:
            _warn_if_open_to_the_network()

    @property
    def max_body_bytes(self) -> int:
        return self.config.ingress.max_body_bytes

    def list_models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": self._created,
                    "owned_by": "tributary",
                    "task": task,
                }
                for names, task in (
                    (self._models, "embedding"),
                    (self._rerank_models, "rerank"),
                    (self._generation_models, "generation"),
                )
                for name in names
            ],
        }

    async def health(self) -> None:
        # Both at once: /healthz must turn within ~1 s of an engine's death.
        down = [name for name, watch in self._watches.items() if watch.down]
        if down:  # known without asking: asking a model with no replica waits out a timeout
            raise NotReady(f"Generation model '{down[0]}' has no running replica; restarting.")
        doubted = [name for name, watch in self._watches.items() if watch.in_doubt]
        if doubted:  # within ms of the death, not after the first probe's timeout
            raise NotReady(f"A replica of generation model '{doubted[0]}' died; checking.")
        problems = await asyncio.gather(self._readiness(), engines_problem(self._generators))
        problem = next((p for p in problems if p is not None), None)
        if problem is not None:
            raise NotReady(problem)

    def read_meta(self, headers: Mapping[str, str]) -> RequestMeta:
        return read_meta(headers, self.config.ingress.admission.max_timeout_s)

    @observed
    async def embed(
        self, body: bytes, meta: RequestMeta, tenant: Tenant | None, dialect: EmbedDialect
    ) -> Answer:
        """/v1/embeddings, Cohere's /v1/embed and /v2/embed, TEI's /embed (embed_dialects)."""
        call = parse_embed_call(body, dialect)
        model = find_model(self._models, call.model)
        priority = self._admit(model, call.priority, meta, tenant)
        job = call.job(model, meta.request_id)
        outcome, hits = await cached_run(
            self.cache,
            model,
            job,
            tenant,
            priority.label,
            lambda j: self._run(model.name, priority, j, embedding_token_estimate(j), meta, tenant),
        )
        body = with_cached_inputs(call.respond(outcome, model.name), hits)
        return Answer(body, {"X-Priority": priority.label})

    async def embedding_model_info(self) -> tuple[EmbeddingModelConfig, dict[str, Any]]:
        """The first embedding model and what its replica says of itself (TEI's /info)."""
        model = find_model(self._models, None)
        return model, await self._clients[model.name].info()

    @observed
    async def rerank(
        self, body: bytes, meta: RequestMeta, tenant: Tenant | None, dialect: Dialect
    ) -> Answer:
        query = parse_rerank_request(body, dialect)
        name = query.model
        if name is None and self._rerank_models:
            name = next(iter(self._rerank_models))  # TEI serves one model and names none
        model = self._rerank_models.get(name or "")
        if name is None:
            raise ModelNotFound("This server has no rerank model.", param="model")
        if model is None:
            raise ModelNotFound(
                f"The rerank model '{name}' does not exist; GET /v1/models lists them "
                "(task: rerank).",
                param="model",
            )
        priority = self._admit(model, query.priority, meta, tenant)
        job = rerank_job(query, model, meta.request_id)
        outcome, hits = await cached_run(
            self.cache,
            model,
            job,
            tenant,
            priority.label,
            lambda j: self._run(model.name, priority, j, rerank_token_estimate(j), meta, tenant),
        )
        answer = with_cached_inputs(rerank_response(query, model.name, outcome), hits)
        return Answer(answer, {"X-Priority": priority.label})

    @observed
    async def generate(
        self, body: bytes, meta: RequestMeta, tenant: Tenant | None, chat: bool
    ) -> Answer:
        """/v1/chat/completions (chat) and /v1/completions (ingress/generation.py)."""
        request = parse_generation_request(body, chat)
        model = self._generation_models.get(request.model)
        if model is None:
            raise ModelNotFound(
                f"The generation model '{request.model}' does not exist; GET /v1/models "
                "lists them (task: generation).",
                param="model",
            )
        priority = self._admit(model, request.priority, meta, tenant)
        note_request(priority=priority.label, items=1)
        job = build_job(request, model, meta.request_id)
        texts = job.prompt or " ".join(m["content"] for m in job.messages or [])
        estimate = estimate_tokens([texts]) + job.max_tokens
        charge = self._guard(lambda: self.access.hold(tenant, estimate))
        timeout_s = timeout_for(self.config.ingress.admission, priority, meta.timeout_s)
        call = GenerationCall(
            model.name, self._generators[model.name], priority, timeout_s, self._watches[model.name]
        )
        with charge.refunded_on_failure():
            first = await call.start(job)
        reply = Reply(chat, model.name)
        headers: dict[str, str] = {"X-Priority": priority.label}
        if request.stream:

            def settle(last: GenerationChunk | None) -> None:
                charge.settle(0 if last is None else last.prompt_tokens + last.completion_tokens)

            events = sse(call, first, reply, request.include_usage, settle)
            return Answer(None, headers, events=events)
        with charge.refunded_on_failure():
            text, last = await collect(call, first)
        charge.settle(last.prompt_tokens + last.completion_tokens)
        return Answer(reply.whole(text, last), headers)

    def _admit(
        self,
        model: EmbeddingModelConfig | RerankModelConfig | GenerationModelConfig,
        body_priority: str | None,
        meta: RequestMeta,
        tenant: Tenant | None,
    ) -> Priority:
        """Labels the request with its model, checks the tenant may use that model, and
        returns its class: the one asked for (header or body), capped at the tenant's tier."""
        note_request(model=model.name, version=model.version)
        self._guard(lambda: self.access.authorize(tenant, model.name))
        asked = choose_priority(meta.priority, body_priority)
        return asked if tenant is None else asked.capped_at(tenant.tier)

    async def _run(
        self,
        model: str,
        priority: Priority,
        job: Any,
        estimate: int,
        meta: RequestMeta,
        tenant: Tenant | None,
    ) -> Any:
        """Charge the tenant, queue the job, wait for its outcome; the tenant pays for the
        tokens the model counted, none for a job that failed."""
        note_request(priority=priority.label, items=len(job))
        charge = self._guard(lambda: self.access.hold(tenant, estimate))
        admission = self.config.ingress.admission.of(priority.label)
        timeout_s = meta.timeout_s if meta.timeout_s is not None else admission.timeout_s
        with charge.refunded_on_failure():
            outcome = await self._submit(model, priority, job, timeout_s)
            if isinstance(outcome, Rejection):
                raise rejection_error(outcome)
        charge.settle(sum(outcome.token_counts))
        return outcome

    async def _submit(self, model: str, priority: Priority, job: Any, timeout_s: float) -> Any:
        queues = self._clients[model].queues
        try:
            self._report_depth(model, priority)
            return await queues.submit(priority, job, loop_deadline(timeout_s))
        except Refused as exc:
            refusal = exc.refusal
            verb = "is shedding" if refusal.reason == "shed" else "has a full queue for"
            raise Overloaded(
                f"Model '{model}' {verb} {priority.label}-class requests "
                f"({refusal.queued_items} inputs waiting, limit {refusal.limit}); "
                f"retry after {refusal.retry_after_s} s.",
                retry_after_s=refusal.retry_after_s,
                status=refusal.status,
                code="load_shed" if refusal.reason == "shed" else "queue_full",
            ) from None
        except DeadlineExpired:
            raise DeadlineExceeded(
                f"No answer within the request's deadline of {timeout_s:g} s "
                "(X-Request-Timeout or the class default)."
            ) from None
        finally:
            # Set as requests come and go: no timer to run, and fresh whenever it moves.
            self._report_depth(model, priority)

    def _report_depth(self, model: str, priority: Priority) -> None:
        depth = self._clients[model].queues.queued_items()[priority]
        self.observer.metrics.queue_depth(model, priority.label, depth)

    def authenticate(self, meta: RequestMeta) -> Tenant | None:
        tenant: Tenant | None = None

        def check() -> None:
            nonlocal tenant
            tenant = self.access.authenticate(meta.authorization)

        self._guard(check)
        return tenant

    def _guard(self, check: Callable[[], T]) -> T:
        try:
            return check()
        except AccessDenied as exc:
            self._denied[exc.kind] = self._denied.get(exc.kind, 0) + 1
            raise _access_error(exc) from None

    async def stats(self) -> dict[str, Any]:
        """This ingress replica's queues per model and class, and one model replica's
        batch counters."""
        # Every model replica at once: a poller's answer should not wait for each in turn.
        names = list(self._clients)
        replicas = await asyncio.gather(*(self._clients[name].info() for name in names))
        models: dict[str, Any] = {}
        for name, replica in zip(names, replicas, strict=True):
            ingress = self._clients[name].queues.stats()
            models[name] = {
                "classes": batching_classes(self.observer, name, ingress, replica),
                "ingress": ingress,
                "replica": replica,
            }
        names = list(self._generators)
        infos = await asyncio.gather(*(self._generators[n].info.remote() for n in names))
        for name, info in zip(names, infos, strict=True):
            models[name] = {
                "classes": generation_classes(self.observer, name, info),
                "replica": info,
            }
        for name, cache_stats in self.cache.stats().items():
            models[name]["cache"] = cache_stats
        return {"models": models, "access_denied": dict(self._denied)}


def _access_error(exc: AccessDenied) -> TributaryError:
    if exc.kind in ("missing_key", "invalid_key"):
        return Unauthorized(exc.message)
    if exc.kind == "model_not_allowed":
        return Forbidden(exc.message, param="model")
    return RateLimited(exc.message, retry_after_s=exc.retry_after_s)


def _warn_if_open_to_the_network() -> None:
    host = _http_host()
    if host is not None and host not in ("127.0.0.1", "localhost", "::1"):
        logger.warning(
            "No API keys are configured and the HTTP server listens on %s: anyone who can "
            "reach it can use every model. Add tenants under auth: in the config "
            "(docs/api.md, 'API keys').",
            host,
        )


def _http_host() -> str | None:
    # Serve keeps the HTTP options with its controller; there is no public getter.
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        return None if client is None else str(client.http_config.host)
    except Exception:
        return None


def _alive_probe(handle: Any) -> Callable[[], Awaitable[Any]]:
    # A function, not a lambda in the comprehension: each probe keeps its own handle.
    return lambda: handle.engine_alive.remote()
