"""`GET /v1/models`: OpenAI's list, each entry with its task and versions."""

from __future__ import annotations

from typing import Any

from deployments.ingress.rollout.catalog import Catalog


def model_list(catalog: Catalog, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "tributary",
                "task": table.task,
                "versions": table.describe(),
            }
            for name, table in catalog.tables.items()
            if table.base is not None
        ],
    }
