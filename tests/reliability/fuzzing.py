"""Schema fuzzing of the live app: schemathesis generates requests from /openapi.json,
positive (what the schema admits) and negative (what it does not), and each answer is
checked: no status >= 500, no hang, every error in the documented shape."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import FailedHealthCheck, Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.schemas import APIOperation

from tests.reliability.shapes import error_shape_problem

CLIENT_TIMEOUT_S = 60  # an answer later than this is a hang
# The server's own deadline for each fuzzed request, well inside the client's.
HEADERS = {"X-Request-Timeout": "30"}
# Which task's models fill the `model` field of a route.
TASK_OF_PATH = {
    "/v1/embeddings": "embedding",
    "/v1/embed": "embedding",
    "/v2/embed": "embedding",
    "/embed": "embedding",
    "/": "embedding",
    "/v1/rerank": "rerank",
    "/v2/rerank": "rerank",
    "/rerank": "rerank",
    "/v1/chat/completions": "generation",
    "/v1/completions": "generation",
}
REAL_MODEL_SHARE = 0.85  # the rest keep whatever the fuzzer generated


@dataclass
class FuzzRun:
    base_url: str
    models: dict[str, list[str]]
    sent: int = 0
    statuses: list[int] = field(default_factory=list)
    by_operation: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    unusable_operations: list[str] = field(default_factory=list)
    session: requests.Session = field(default_factory=requests.Session)

    def fail(self, what: str) -> None:
        if len(self.failures) < 200:
            self.failures.append(what)
        else:
            self.failures[-1] = f"... and more (last: {what})"

    def send(self, operation: APIOperation, case: Any, pick: float) -> None:
        self._fill_model(operation, case, pick)
        label = f"{case.method} {case.path}"
        self.sent += 1
        counts = self.by_operation.setdefault(label, {})
        try:
            response = case.call(
                base_url=self.base_url,
                session=self.session,
                headers=HEADERS,
                timeout=CLIENT_TIMEOUT_S,
            )
        except requests.Timeout:
            counts["hang"] = counts.get("hang", 0) + 1
            self.fail(f"hang: {label} no answer in {CLIENT_TIMEOUT_S}s body={_short(case.body)}")
            return
        except requests.RequestException as exc:
            self.fail(f"no answer: {label} {type(exc).__name__} body={_short(case.body)}")
            return
        status = response.status_code
        self.statuses.append(status)
        counts[str(status)] = counts.get(str(status), 0) + 1
        if status >= 500:
            self.fail(f"{status}: {label} body={_short(case.body)} -> {response.text[:200]}")
        elif status >= 400:
            problem = error_shape_problem(response.content)
            if problem is not None:
                self.fail(f"{status} shape: {label} body={_short(case.body)}: {problem}")

    def _fill_model(self, operation: APIOperation, case: Any, pick: float) -> None:
        names = self.models.get(TASK_OF_PATH.get(operation.path, ""), [])
        if names and isinstance(case.body, dict) and pick < REAL_MODEL_SHARE:
            case.body["model"] = names[int(pick / REAL_MODEL_SHARE * len(names)) % len(names)]


def _short(body: Any) -> str:
    return repr(body)[:300]


def load_schema(base_url: str) -> Any:
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json", timeout=30)


def fuzz(run: FuzzRun, total: int) -> None:
    """Sends about `total` generated requests, shared out over every usable operation and
    both generation modes; rounds repeat until the total is reached, since Hypothesis stops
    early on an operation with few distinct inputs."""
    schema = load_schema(run.base_url)
    operations: list[APIOperation] = []
    for result in schema.get_all_operations():
        try:
            operations.append(result.ok())
        except Exception as exc:  # an operation the schema itself makes unusable
            run.unusable_operations.append(str(exc)[:300])
    if not operations:
        run.fail("no usable operation in /openapi.json")
        return
    jobs = [(op, mode) for op in operations for mode in GenerationMode]
    while run.sent < total:
        before = run.sent
        share = max(1, math.ceil((total - run.sent) / len(jobs)))
        for operation, mode in jobs:
            _fuzz_one(run, operation, mode, min(share, total - run.sent))
            if run.sent >= total:
                break
        if run.sent == before:
            run.fail("the fuzzer generated nothing more")
            return


def _fuzz_one(run: FuzzRun, operation: APIOperation, mode: GenerationMode, examples: int) -> None:
    if examples <= 0:
        return
    try:
        strategy = operation.as_strategy(generation_mode=mode)
    except Exception as exc:  # e.g. a $ref that does not resolve
        run.unusable_operations.append(f"{operation.method} {operation.path} {mode}: {exc}"[:300])
        return

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(case=strategy, pick=st.floats(0, 1, exclude_max=True))
    def one(case: Any, pick: float) -> None:
        run.send(operation, case, pick)

    # Fewer inputs for this operation and mode than asked: the next round makes up.
    with contextlib.suppress(Unsatisfiable, FailedHealthCheck):
        one()
