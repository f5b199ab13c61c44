"""The base of every config model: strict about keys, immutable once validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    # Unknown keys are typos in a config file; reject them instead of ignoring them.
    model_config = ConfigDict(extra="forbid", frozen=True)
