"""The `batches:` section of the app args: the OpenAI Batch API (files and batches run at
the batch class by the ingress itself; docs/operations.md, "Batch jobs")."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from deployments.config.strict import StrictModel


class BatchesConfig(StrictModel):
    enabled: bool = Field(True, description="Serve /v1/files and /v1/batches.")
    store: Literal["sqlite", "redis"] = Field(
        "sqlite",
        description="sqlite: one node, no server (a database file under `path`); redis: "
        "every ingress replica of a cluster shares batch state in Redis (`url`), and `path` "
        "must be a directory every node reaches (NFS, a mounted bucket).",
    )
    path: str | None = Field(
        None,
        description="Directory of the uploaded and produced files (and of the sqlite "
        "database); None = the user's data directory (~/.local/share/tributary/batches).",
    )
    url: str | None = Field(None, description="redis: redis://host:port/db")
    max_file_bytes: int = Field(
        200 * 1024 * 1024, ge=1024, description="Largest uploaded file (413)."
    )
    max_line_bytes: int = Field(
        1024 * 1024, ge=256, description="Largest line of an input file (413 at upload)."
    )
    max_lines_per_batch: int = Field(
        100_000, ge=1, description="Most request lines in one batch's input file (400)."
    )
    max_open_batches: int = Field(
        16, ge=1, description="Batches of one tenant not yet finished (429 above it)."
    )
    max_in_flight_lines: int = Field(
        512,
        ge=1,
        description="Most lines one dispatcher has waiting or running at once, and never more "
        "than the batch class admits (ingress.admission.batch); fewer while lines are refused "
        "(429/503), a few while realtime or normal work runs, none while it is queued. Enough "
        "to keep the model's batch-class passes full.",
    )
    lease_s: float = Field(
        15,
        gt=0,
        description="How long a dispatcher's claim on a batch lasts without a heartbeat; "
        "after it another ingress replica (or a restarted one) resumes the batch.",
    )
    poll_s: float = Field(1.0, gt=0, description="How often an idle dispatcher looks for work.")

    @model_validator(mode="after")
    def _consistent(self) -> BatchesConfig:
        if self.store == "redis" and not self.url:
            raise ValueError("batches: store redis needs url (redis://host:port)")
        if self.store == "redis" and not self.path:
            raise ValueError("batches: store redis needs path (a directory every node reaches)")
        return self
