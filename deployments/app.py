"""`build_app(args)`: the one place that binds deployments into an application.

serve_config.yaml names `deployments.app:build_app` as its import path and passes its
`args`; they are validated here, so a bad config fails before anything starts.
"""

from __future__ import annotations

from typing import Any, cast

from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from deployments.backends.generation.demo_llm import DEMO_PREFIX
from deployments.backends.sources import ModelSourceError, resolve_model_source
from deployments.config import AppConfig, GenerationModelConfig, ModelDeploymentConfig
from deployments.config.allocator import Allocator
from deployments.config.encoders import EncoderModelConfig
from deployments.config.traffic import ModelAppConfig
from deployments.core.protocol import BatchedModel
from deployments.http.server import HttpIngress
from deployments.ingress.access.tenants import build_access_control
from deployments.ingress.rollout.clients import version_key
from deployments.replicas.batched.embedder import Embedder
from deployments.replicas.batched.reranker import Reranker
from deployments.replicas.generation.generator import Generator

GENERATION_ROUTER = "deployments.ingress.calls.generation_router:GenerationRouter"


def build_app(args: dict[str, Any]) -> Application:
    config = AppConfig.model_validate(args)
    for kind, models in (
        ("embedding", config.embedding_models),
        ("rerank", config.rerank_models),
        ("generation", config.generation_models),
    ):
        for model in models:
            _check_source(kind, model)
    # A missing key file or variable fails the deploy here, not in the ingress replica.
    build_access_control(config.auth)
    names = _DeploymentNames()
    config = with_device_arbiter(config)
    malloc = config.allocator
    embedders = {
        version_key(m.name, m.version): _model_deployment(Embedder, names("embed", m), m, malloc)
        for m in config.embedding_models
    }
    rerankers = {
        version_key(m.name, m.version): _model_deployment(Reranker, names("rerank", m), m, malloc)
        for m in config.rerank_models
    }
    generators = {
        version_key(m.name, m.version): _generator(names("generate", m), m, malloc)
        for m in config.generation_models
    }
    ingress_options = config.ingress.deployment.to_serve(allocator=malloc)
    ingress = _deployment(serve.ingress()(HttpIngress)).options(name="ingress", **ingress_options)
    return ingress.bind(
        ingress_args(config),
        embedders=embedders,
        rerankers=rerankers,
        generators=generators,
    )


def with_device_arbiter(config: AppConfig) -> AppConfig:
    """Every model on a device takes turns by the same rules: the app's `device_arbiter`,
    copied into each model's config (its replicas see only their own)."""
    return config.model_copy(
        update={
            kind: [m.model_copy(update={"device_arbiter": config.device_arbiter}) for m in models]
            for kind, models in (
                ("embedding_models", config.embedding_models),
                ("rerank_models", config.rerank_models),
                ("generation_models", config.generation_models),
            )
        }
    )


def ingress_args(config: AppConfig) -> dict[str, Any]:
    """The ingress's copy of the config: all of it but the encoder models' `batching`, so a
    change of batch knobs reconfigures the model replicas in place and never restarts the
    ingress. What the ingress shows of a model's batching (TEI's /info) it asks the model's
    replica, which holds the knobs as they are now."""
    without_batching = {
        "embedding_models": {"__all__": {"batching"}},
        "rerank_models": {"__all__": {"batching"}},
    }
    return config.model_dump(exclude=without_batching)


def build_model_app(args: dict[str, Any]) -> Application:
    """One version of one model as an application of its own, with no HTTP route: the
    main app's ingress reaches it by the application's name, as its traffic policy says
    (docs/operations.md, "Gray release"). Adding or removing such an application leaves
    every other application's replicas as they are."""
    config = ModelAppConfig.model_validate(args)
    malloc = config.allocator
    if config.embedding_model is not None:
        model = config.embedding_model
        _check_source("embedding", model)
        return _model_deployment(Embedder, _version_name("embed", model), model, malloc)
    if config.rerank_model is not None:
        reranker = config.rerank_model
        _check_source("rerank", reranker)
        return _model_deployment(Reranker, _version_name("rerank", reranker), reranker, malloc)
    assert config.generation_model is not None
    generation = config.generation_model
    _check_source("generation", generation)
    return _generator(_version_name("generate", generation), generation, malloc)


class _DeploymentNames:
    """A model's first version keeps the name it had before versions (`embed-<name>`), so
    deployment overrides in existing configs still apply; later ones add `@<version>`."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, prefix: str, model: ModelDeploymentConfig) -> str:
        first = model.name not in self._seen
        self._seen.add(model.name)
        return f"{prefix}-{model.name}" if first else _version_name(prefix, model)


def _version_name(prefix: str, model: ModelDeploymentConfig) -> str:
    return f"{prefix}-{version_key(model.name, model.version)}"


def _check_source(kind: str, model: Any) -> None:
    # Fails here, naming the model, rather than later inside a replica.
    if kind == "generation" and model.source.startswith(DEMO_PREFIX):
        return  # demo models are built on first use
    try:
        resolve_model_source(model.source)
    except ModelSourceError as exc:
        raise ModelSourceError(f"{kind} model {model.name!r}: {exc}") from None


def _generator(name: str, model: GenerationModelConfig, allocator: Allocator) -> Application:
    # The queue limits are the generator's user_config, changeable without a restart. The
    # router sends a stop note to the replica that runs its generation, and keeps the
    # standby replicas out of the calls while enough others are up.
    options = model.deployment.to_serve(allocator=allocator)
    router: dict[str, Any] = {"request_router_class": GENERATION_ROUTER}
    if model.standby_replicas:  # a fixed count (config/generation.py): to_serve set it
        serving = options["num_replicas"]
        options["num_replicas"] = serving + model.standby_replicas
        router["request_router_kwargs"] = {"serving_replicas": serving}
    return (
        _deployment(Generator)
        .options(
            name=name,
            user_config=model.queue.model_dump(),
            request_router_config=router,
            **options,
        )
        .bind(model.model_dump())
    )


def _model_deployment(
    cls: type[BatchedModel[Any, Any]],
    name: str,
    model: ModelDeploymentConfig,
    allocator: Allocator,
) -> Application:
    # Batch knobs travel only as each model deployment's user_config: changing them with
    # `serve deploy` then reconfigures the running replicas in place, where a change to
    # any constructor argument would restart them.
    fenced = isinstance(model, EncoderModelConfig) and model.memory_limit_mib is not None
    options = model.deployment.to_serve(
        busy_policy=True, allocator=allocator, address_space_fenced=fenced
    )
    return (
        _deployment(cls)
        .options(name=name, user_config=model.batching.model_dump(), **options)
        .bind(model.model_dump(exclude={"batching"}))
    )


def _deployment(cls: type) -> Deployment:
    # Ray annotates serve.deployment's return for its with-arguments form only; called on a
    # class it returns the Deployment.
    return cast(Deployment, serve.deployment(cls))
