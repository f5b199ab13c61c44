"""`build_app(args)`: the one place that binds deployments into an application.

serve_config.yaml names `deployments.app:build_app` as its import path and passes its
`args`; they are validated here, so a bad config fails before anything starts.
"""

from __future__ import annotations

from typing import Any, cast

from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from deployments.backends.demo_llm import DEMO_PREFIX
from deployments.backends.sources import ModelSourceError, resolve_model_source
from deployments.config import AppConfig, ModelDeploymentConfig
from deployments.http.server import HttpIngress
from deployments.ingress.tenants import build_access_control
from deployments.replicas.embedder import Embedder
from deployments.replicas.generator import Generator
from deployments.replicas.reranker import Reranker


def build_app(args: dict[str, Any]) -> Application:
    config = AppConfig.model_validate(args)
    for kind, models in (("embedding", config.embedding_models), ("rerank", config.rerank_models)):
        for model in models:
            # Fails here, naming the model, rather than later inside a replica.
            try:
                resolve_model_source(model.source)
            except ModelSourceError as exc:
                raise ModelSourceError(f"{kind} model {model.name!r}: {exc}") from None
    for generation in config.generation_models:
        if not generation.source.startswith(DEMO_PREFIX):  # demo models are built on first use
            try:
                resolve_model_source(generation.source)
            except ModelSourceError as exc:
                raise ModelSourceError(f"generation model {generation.name!r}: {exc}") from None
    # A missing key file or variable fails the deploy here, not in the ingress replica.
    build_access_control(config.auth)
    # Batch knobs travel only as each model deployment's user_config: changing them with
    # `serve deploy` then reconfigures the running replicas in place, where a change to
    # any constructor argument would restart them.
    embedders = {m.name: _model_deployment(Embedder, "embed", m) for m in config.embedding_models}
    rerankers = {m.name: _model_deployment(Reranker, "rerank", m) for m in config.rerank_models}
    # The queue limits are the generator's user_config, changeable without a restart.
    generators = {
        m.name: _deployment(Generator)
        .options(
            name=f"generate-{m.name}",
            user_config=m.queue.model_dump(),
            **m.deployment.to_serve(),
        )
        .bind(m.model_dump())
        for m in config.generation_models
    }
    ingress = _deployment(serve.ingress()(HttpIngress)).options(
        name="ingress", **config.ingress.deployment.to_serve()
    )
    without_batching = {
        "embedding_models": {"__all__": {"batching"}},
        "rerank_models": {"__all__": {"batching"}},
    }
    return ingress.bind(
        config.model_dump(exclude=without_batching),
        embedders=embedders,
        rerankers=rerankers,
        generators=generators,
    )


def _model_deployment(cls: type, prefix: str, model: ModelDeploymentConfig) -> Application:
    return (
        _deployment(cls)
        .options(
            name=f"{prefix}-{model.name}",
            user_config=model.batching.model_dump(),
            **model.deployment.to_serve(),
        )
        .bind(model.model_dump(exclude={"batching"}))
    )


def _deployment(cls: type) -> Deployment:
    # Ray annotates serve.deployment's return for its with-arguments form only; called on a
    # class it returns the Deployment.
    return cast(Deployment, serve.deployment(cls))
