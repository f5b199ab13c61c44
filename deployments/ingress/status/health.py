"""`GET /healthz` for one ingress: Serve's view of every deployment, and each generation
engine asked directly (readiness.py), after what the ingress already knows of its replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from deployments.errors import NotReady
from deployments.ingress.rollout.catalog import Catalog
from deployments.ingress.rollout.clients import version_key
from deployments.ingress.status.readiness import engines_problem, serve_readiness

ReadinessCheck = Callable[[], Awaitable[str | None]]


class Health:
    def __init__(self, catalog: Catalog, readiness: ReadinessCheck | None = None) -> None:
        self._catalog = catalog
        seen_whole: set[str] = set()  # deployments seen with every replica running
        self._readiness = readiness or (lambda: serve_readiness(seen_whole))

    async def check(self) -> None:
        """Returns when every deployment can serve; raises `NotReady` saying why not."""
        watches = [
            (name, v.watch)
            for name, v in self._catalog.versions_of_task("generation")
            if v.watch is not None
        ]
        down = [name for name, watch in watches if watch.down]
        if down:  # known without asking: asking a model with no replica waits out a timeout
            raise NotReady(f"Generation model '{down[0]}' has no running replica; restarting.")
        doubted = [name for name, watch in watches if watch.in_doubt]
        if doubted:  # within ms of the death, not after the first probe's timeout
            raise NotReady(f"A replica of generation model '{doubted[0]}' died; checking.")
        # Both at once: /healthz must turn within ~1 s of an engine's death.
        problems = await asyncio.gather(
            self._readiness(), engines_problem(self._generation_handles())
        )
        problem = next((p for p in problems if p is not None), None)
        if problem is not None:
            raise NotReady(problem)

    def _generation_handles(self) -> dict[str, Any]:
        # A model with one version is named alone, as clients know it.
        catalog = self._catalog
        return {
            name if len(catalog.table(name).versions) == 1 else version_key(name, v.label): (
                v.handle
            )
            for name, v in catalog.versions_of_task("generation")
        }
