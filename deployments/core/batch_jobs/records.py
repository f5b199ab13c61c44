"""What the Batch API keeps: a file's and a batch's record, and their OpenAI shapes.

A record is stored as the JSON of its fields (`to_json` / `from_json`); the `tenant` never
goes on the wire. Pure: the stores and the routes share these.
"""

from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson

# Statuses, in OpenAI's words: validating -> in_progress -> finalizing -> completed, or
# failed / expired / cancelling -> cancelled.
VALIDATING = "validating"
IN_PROGRESS = "in_progress"
FINALIZING = "finalizing"
COMPLETED = "completed"
FAILED = "failed"
EXPIRED = "expired"
CANCELLING = "cancelling"
CANCELLED = "cancelled"
OPEN_STATUSES = frozenset({VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING})

WINDOWS_S = {"24h": 24 * 3600}


def new_file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def new_batch_id() -> str:
    return f"batch_{secrets.token_hex(12)}"


@dataclass
class FileRecord:
    id: str
    tenant: str
    filename: str
    purpose: str  # batch (uploaded), batch_output (produced)
    size: int  # bytes
    created_at: int
    lines: int = 0  # non-blank lines, counted at upload

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.size,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
            "expires_at": None,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: bytes | str) -> FileRecord:
        return cls(**orjson.loads(data))


@dataclass
class BatchRecord:
    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    created_at: int
    expires_at: int
    total: int
    metadata: dict[str, str] | None = None
    status: str = VALIDATING
    completed: int = 0  # lines answered 2xx so far (the store's count while it runs)
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: list[dict[str, Any]] | None = None
    times: dict[str, int] = field(default_factory=dict)  # in_progress_at, ... by status

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES

    def move_to(self, status: str, now: int) -> None:
        self.status = status
        self.times[f"{status}_at"] = now

    def to_openai(self) -> dict[str, Any]:
        stamps = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling")
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": None if not self.errors else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            **{f"{s}_at": self.times.get(f"{s}_at") for s in stamps},
            "cancelled_at": self.times.get("cancelled_at"),
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
            "metadata": self.metadata,
        }

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, data: bytes | str) -> BatchRecord:
        return cls(**orjson.loads(data))
