"""Every model the ingress serves, with its versions: those in the app's args, bound at
build time, and those the traffic policy names in applications of their own, reached
through Serve when the policy arrives (`reconfigure`) and kept while it names them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from deployments.config import (
    AppConfig,
    EmbeddingModelConfig,
    GenerationModelConfig,
    ModelConfig,
    RerankModelConfig,
)
from deployments.config.traffic import TrafficConfig
from deployments.core.metrics.metrics import TributaryMetrics
from deployments.core.protocol import ModelHandle
from deployments.errors import NotReady
from deployments.ingress.rollout.clients import attach, version_key
from deployments.ingress.rollout.versions import ModelVersions, Version

logger = logging.getLogger("ray.serve")

CONFIG_TYPES: dict[str, type[ModelConfig]] = {
    "embedding": EmbeddingModelConfig,
    "rerank": RerankModelConfig,
    "generation": GenerationModelConfig,
}
# How long one attempt to reach a version's application waits, and between attempts.
RESOLVE_TIMEOUT_S = 5.0
RESOLVE_RETRY_S = 1.0

AppHandle = Callable[[str], ModelHandle]  # application name -> handle of its deployment
# Per task, `name@version` (or the name alone) -> the handle of its replicas.
TaskHandles = Mapping[str, Mapping[str, ModelHandle]]


class Catalog:
    def __init__(
        self,
        config: AppConfig,
        handles: TaskHandles,
        app_handle: AppHandle,
        metrics: TributaryMetrics,
    ) -> None:
        self._settings = config.ingress
        self._metrics = metrics
        self._app_handle = app_handle
        self._resolvers: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.tables: dict[str, ModelVersions] = {}
        self.traffic = TrafficConfig()
        self.error: str | None = None
        models: dict[str, list[Any]] = {
            "embedding": list(config.embedding_models),
            "rerank": list(config.rerank_models),
            "generation": list(config.generation_models),
        }
        for task, configs in models.items():
            for model in configs:
                table = self.tables.setdefault(model.name, ModelVersions(model.name, task))
                version = Version(model.version, None, model)
                per_task = handles.get(task, {})
                handle = per_task.get(version_key(model.name, model.version))
                if handle is None:  # tests and older callers key by name alone
                    handle = per_task[model.name]
                attach(version, task, handle, config.ingress, metrics)
                table.versions[model.version] = version

    def of_task(self, task: str) -> dict[str, Any]:
        """name -> the config requests are checked against, for models that can answer."""
        return {
            name: table.base
            for name, table in self.tables.items()
            if table.task == task and table.base is not None
        }

    def refuse_if_starting(self, name: str | None) -> None:
        """A model the policy names whose versions' applications do not answer yet is
        not unknown: it gets a 503 to retry, not a 404."""
        table = self.tables.get(name or "")
        if table is not None and table.base is None:
            raise NotReady(
                f"Model '{name}' has no version that answers yet (its applications are starting).",
                retry_after_s=2,
            )

    def table(self, name: str) -> ModelVersions:
        return self.tables[name]

    def versions_of_task(self, task: str) -> list[tuple[str, Version]]:
        return [
            (name, version)
            for name, table in self.tables.items()
            if table.task == task
            for version in table.versions.values()
            if version.ready
        ]

    def apply(self, raw: dict[str, Any] | None) -> None:
        """The ingress's user_config. A bad one is logged and shown in /v1/stats and the
        last good one stays: raising here would fail the ingress for every client."""
        try:
            traffic = TrafficConfig.model_validate(raw or {})
            self._check(traffic)
        except Exception as exc:
            self.error = f"traffic policy not applied: {exc}"
            logger.error("%s", self.error)
            return
        self.error = None
        self.traffic = traffic
        wanted: set[tuple[str, str]] = set()
        for name, policy in traffic.models.items():
            table = self.tables.setdefault(name, ModelVersions(name, None))
            for label, place in policy.versions.items():
                wanted.add((name, label))
                current = table.versions.get(label)
                if current is not None and current.app == place.app:
                    continue
                table.versions[label] = Version(label, place.app)
                self._start_resolver(table, table.versions[label])
        for name, table in list(self.tables.items()):
            for label, version in list(table.versions.items()):
                if version.app is not None and (name, label) not in wanted:
                    self._stop_resolver(name, label)
                    del table.versions[label]
            if not table.versions:
                del self.tables[name]
                continue
            table.apply(traffic.models.get(name, type(table.policy)()))

    def _check(self, traffic: TrafficConfig) -> None:
        for name, policy in traffic.models.items():
            table = self.tables.get(name)
            in_args = (
                {v.label for v in table.versions.values() if v.app is None} if table else set()
            )
            clash = sorted(in_args & set(policy.versions))
            if clash:
                raise ValueError(f"model {name!r}: version(s) {clash} are in the app's args")
            known = in_args | set(policy.versions)
            if not known:
                raise ValueError(f"model {name!r} has no versions here or in `versions`")
            named = set(policy.weights)
            if policy.shadow is not None:
                named.add(policy.shadow.version)
            unknown = sorted(named - known)
            if unknown:
                raise ValueError(f"model {name!r}: unknown version(s) {unknown}")

    def _start_resolver(self, table: ModelVersions, version: Version) -> None:
        self._stop_resolver(table.name, version.label)
        task = asyncio.get_running_loop().create_task(self._resolve(table, version))
        self._resolvers[(table.name, version.label)] = task

    def _stop_resolver(self, name: str, label: str) -> None:
        task = self._resolvers.pop((name, label), None)
        if task is not None:
            task.cancel()

    async def _resolve(self, table: ModelVersions, version: Version) -> None:
        assert version.app is not None
        while True:
            try:
                handle = self._app_handle(version.app)
                described = await asyncio.wait_for(handle.model_config.remote(), RESOLVE_TIMEOUT_S)
                config = CONFIG_TYPES[described["task"]].model_validate(described["config"])
                if config.name != table.name or config.version != version.label:
                    raise ValueError(
                        f"application {version.app!r} serves {config.name}@{config.version}, "
                        f"not {table.name}@{version.label}"
                    )
                if table.task not in (None, described["task"]):
                    raise ValueError(f"{table.name} is a {table.task} model here")
                table.task = described["task"]
                attach(version, described["task"], handle, self._settings, self._metrics)
                version.config = config
                logger.info(
                    "model %s: version %s reached in app %s", table.name, version.label, version.app
                )
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                logger.info(
                    "model %s: version %s not reachable yet: %r", table.name, version.label, exc
                )
            await asyncio.sleep(RESOLVE_RETRY_S)

    async def close(self) -> None:
        for task in self._resolvers.values():
            task.cancel()
        for task in self._resolvers.values():
            with contextlib.suppress(BaseException):
                await task
