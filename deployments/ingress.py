"""The ingress deployment: parse, validate, route, answer. Logic lives in core/.

`Ingress` is a plain class built from deployment handles; `app.py` wraps it with
`serve.ingress()`, and Serve calls `__serve_build_asgi_app__` on the replica to get the
HTTP app. Tests build the same class with fake handles and call the app directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ray.exceptions import RayActorError
from ray.serve.exceptions import (
    BackPressureError,
    DeploymentUnavailableError,
    ReplicaUnavailableError,
)

from deployments.config import AppConfig, EmbeddingModelConfig
from deployments.core.coalescer import Coalescer, QueueFull
from deployments.core.jobs import EmbedJob, EmbedOutcome, EmbedRejection
from deployments.errors import (
    InvalidRequest,
    ModelFailed,
    ModelNotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    TributaryError,
)
from deployments.http_app import build_http_app
from deployments.response import embedding_response
from deployments.schemas import EmbeddingRequest, parse_embedding_request

logger = logging.getLogger("ray.serve")


ReadinessCheck = Callable[[], Awaitable[str | None]]


class Ingress:
    def __init__(
        self,
        config: dict[str, Any],
        embedders: dict[str, Any],  # model name -> DeploymentHandle of its Embedder
        readiness: ReadinessCheck | None = None,
    ) -> None:
        self.config = AppConfig.model_validate(config)
        self._models: dict[str, EmbeddingModelConfig] = {
            m.name: m for m in self.config.embedding_models
        }
        self._created = int(time.time())
        self._readiness = readiness or _serve_readiness
        self._embedders = embedders
        ingress = self.config.ingress
        self._coalescers: dict[str, Coalescer[EmbedJob, EmbedOutcome]] = {
            name: Coalescer(
                _caller(embedders[name]),
                size_of=len,
                max_in_flight=ingress.max_in_flight_per_model,
                max_group_items=ingress.max_group_items,
                max_pending_items=ingress.max_pending_items,
            )
            for name in self._models
        }

    def __serve_build_asgi_app__(self) -> Any:
        return build_http_app(self)

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
                    "task": "embedding",
                }
                for name in self._models
            ],
        }

    async def health(self) -> None:
        problem = await self._readiness()
        if problem is not None:
            raise NotReady(problem)

    async def embed(self, body: bytes) -> dict[str, Any]:
        request = parse_embedding_request(body)
        model = self._models.get(request.model)
        if model is None:
            raise ModelNotFound(
                f"The model '{request.model}' does not exist; GET /v1/models lists them.",
                param="model",
            )
        job = _job_of(request, model)
        try:
            outcome = await self._coalescers[model.name].submit(job)
        except QueueFull as exc:
            raise Overloaded(
                f"Too many inputs are waiting for model '{model.name}'; retry shortly.",
                retry_after_s=1,
            ) from exc
        if isinstance(outcome, EmbedRejection):
            raise _rejection_error(outcome)
        return embedding_response(outcome, request)

    async def stats(self) -> dict[str, Any]:
        """This ingress replica's coalescing counters and one model replica's batch
        counters, per model."""
        models: dict[str, Any] = {}
        for name, coalescer in self._coalescers.items():
            replica = await self._embedders[name].info.remote()
            models[name] = {"ingress": vars(coalescer.stats), "replica": replica}
        return {"models": models}


def _caller(handle: Any) -> Callable[[list[EmbedJob]], Awaitable[list[EmbedOutcome]]]:
    async def call(jobs: list[EmbedJob]) -> list[EmbedOutcome]:
        try:
            return await handle.embed_jobs.remote(jobs)
        except BackPressureError as exc:
            raise Overloaded("The model's queue is full; retry shortly.", retry_after_s=1) from exc
        except (RayActorError, DeploymentUnavailableError, ReplicaUnavailableError) as exc:
            logger.warning("model replica unavailable: %r", exc)
            raise NotReady(
                "The model is restarting or unavailable; retry shortly.", retry_after_s=2
            ) from exc

    return call


def _job_of(request: EmbeddingRequest, model: EmbeddingModelConfig) -> EmbedJob:
    value = request.input
    if isinstance(value, str):
        job = EmbedJob(texts=[value])
    elif not value:
        raise InvalidRequest("'input' must not be an empty array.", param="input")
    elif isinstance(value[0], str):
        job = EmbedJob(texts=value)  # type: ignore[arg-type]
    elif isinstance(value[0], int):
        job = EmbedJob(token_ids=[value])  # type: ignore[list-item]
    else:
        job = EmbedJob(token_ids=value)  # type: ignore[arg-type]
    inputs = job.texts if job.texts is not None else job.token_ids
    assert inputs is not None
    if any(len(item) == 0 for item in inputs):
        raise InvalidRequest("'input' must not contain empty strings or arrays.", param="input")
    if len(inputs) > model.max_inputs:
        raise PayloadTooLarge(
            f"{len(inputs)} inputs in one request; model '{model.name}' accepts at most "
            f"{model.max_inputs}.",
            param="input",
        )
    return job


def _rejection_error(rejection: EmbedRejection) -> TributaryError:
    if rejection.status >= 500:
        return ModelFailed()
    return InvalidRequest(
        rejection.message, param=rejection.param, code=rejection.code, status=rejection.status
    )


async def _serve_readiness() -> str | None:
    """None when every deployment of every application is healthy and has all its
    replicas running (a model replica only runs once it has loaded and warmed up)."""
    from ray import serve

    try:
        status = await asyncio.to_thread(serve.status)
    except Exception:
        logger.exception("could not read Serve's status")
        return "Serve's status is unavailable."
    for app_name, app in status.applications.items():
        for name, deployment in app.deployments.items():
            if deployment.status != "HEALTHY":
                return f"Deployment {app_name}/{name} is {deployment.status}."
            not_running = {
                state: count
                for state, count in deployment.replica_states.items()
                if state != "RUNNING" and count
            }
            if not_running:
                return f"Deployment {app_name}/{name} has replicas {not_running}."
    return None
