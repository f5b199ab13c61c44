"""`GET /v1/stats`: per model, this ingress replica's queues and one replica's counters of
each version, the traffic split, shadow agreement, the canary guard and the result cache;
then the ingress's refusals at the door, the requests it holds and the shares of traffic
it asks HAProxy to refuse."""

from __future__ import annotations

import asyncio
from typing import Any

from deployments.core.admission.front_shedding import FrontShedding
from deployments.core.admission.held_requests import HeldRequests
from deployments.ingress.access.gate import AccessGate
from deployments.ingress.cache.item_cache import ItemCaches
from deployments.ingress.calls.generation_call import STOP_NOTES
from deployments.ingress.calls.observe import RequestObserver
from deployments.ingress.calls.standby import STANDBY_COUNTS
from deployments.ingress.calls.stop_note_router import RUNS
from deployments.ingress.rollout.catalog import Catalog
from deployments.ingress.rollout.versions import Version
from deployments.ingress.status.stats_view import batching_classes, generation_classes
from deployments.ingress.tasks.shadow import ShadowCopies

# A version whose application went away must not hold up the whole answer.
INFO_TIMEOUT_S = 5.0


class Stats:
    def __init__(
        self,
        catalog: Catalog,
        observer: RequestObserver,
        shadows: ShadowCopies,
        cache: ItemCaches,
        gate: AccessGate,
        held: HeldRequests,
        front_shedding: FrontShedding | None = None,
    ) -> None:
        self._parts = (catalog, observer, shadows)
        self._cache = cache
        self._gate = gate
        self._held = held
        self._front_shedding = front_shedding

    async def gather(self) -> dict[str, Any]:
        stats = await gather_stats(*self._parts)
        for name, cache_stats in self._cache.stats().items():
            if name in stats["models"]:
                stats["models"][name]["cache"] = cache_stats
        return {
            **stats,
            "access_denied": self._gate.denied(),
            "held_requests": self._held.report(),
            # Generations in flight whose replica the stop-note router remembers.
            "stop_note_runs": len(RUNS),
            # Per route family and X-Priority: the share HAProxy is told to refuse.
            "front_door_shares": (
                None if self._front_shedding is None else self._front_shedding.shares()
            ),
        }


async def gather_stats(
    catalog: Catalog, observer: RequestObserver, shadows: ShadowCopies
) -> dict[str, Any]:
    tables = catalog.tables
    ready = [
        (name, v) for name, table in tables.items() for v in table.versions.values() if v.ready
    ]
    # Every model replica at once: a poller's answer should not wait for each in turn.
    infos = await asyncio.gather(*(_info(version) for _, version in ready))
    per_version: dict[str, dict[str, Any]] = {}
    for (name, version), info in zip(ready, infos, strict=True):
        entry: dict[str, Any] = {"replica": info}
        if version.client is not None:
            queues = version.client.queues.stats()
            entry["ingress"] = queues
            entry["classes"] = batching_classes(observer, name, queues, info)
        else:
            entry["classes"] = generation_classes(observer, name, info)
            entry["stop_notes"] = STOP_NOTES.of(name)
            # Replicas serving and standing by, as this process's router last saw them.
            entry["replicas"] = STANDBY_COUNTS.of(getattr(version.handle, "deployment_name", ""))
        per_version.setdefault(name, {})[version.label] = entry
    models: dict[str, Any] = {}
    for name, table in tables.items():
        described = table.describe()
        seen = per_version.get(name, {})
        if not seen:
            models[name] = {"versions": described}
            continue
        # The version with the largest share stands for the model, as before versions.
        lead = max(described, key=lambda d: (d["share"], d["version"] in seen))["version"]
        shown = dict(seen.get(lead) or next(iter(seen.values())))
        for item in described:
            item.update(seen.get(item["version"], {}))
        shown["versions"] = described
        shown["shadow"] = shadows.view(name)
        shown["guard"] = None if table.guard is None else table.guard.snapshot()
        models[name] = shown
    return {"models": models, "traffic_error": catalog.error}


async def _info(version: Version) -> dict[str, Any]:
    try:
        if version.client is not None:
            return await asyncio.wait_for(version.client.info(), INFO_TIMEOUT_S)
        if version.handle is not None:
            return await asyncio.wait_for(version.handle.info.remote(), INFO_TIMEOUT_S)
        return {"error": "no client"}
    except Exception as exc:
        return {"error": f"no answer: {type(exc).__name__}"}
