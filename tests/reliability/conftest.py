"""The reliability suite's server: the default application (serve_config.yaml unchanged:
its models, its limits, HAProxy in front) started once for this folder through
`python -m deployments.launch`, as `make serve` runs it. Package scope, so that it is
stopped before the next folder's tests start their own Ray on the same two cores."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from bench.server import Server, load_config, running_server
from tests.reliability import report
from tests.reliability.replica_kill import chat_body
from tests.reliability.settings import is_full, sizes


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Admission by predicted wait on: the overload test checks its goals.
    config = load_config()
    config["applications"][0]["args"]["ingress"]["admission"]["predict_wait"] = True
    with running_server(config, tmp_path_factory.mktemp("reliability")) as server:
        yield server


@pytest.fixture(scope="package")
def models(server: Server) -> dict[str, list[str]]:
    """The served model names by task (embedding, rerank, generation)."""
    listed = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"]
    by_task: dict[str, list[str]] = {}
    for entry in listed:
        by_task.setdefault(entry["task"], []).append(entry["id"])
    return by_task


def wait_for_generation(server: Server, model: str, timeout_s: float = 90) -> None:
    """Waits until `model` answers a small completion: each test starts from a working
    server even when the one before it broke generation for a while."""
    deadline = time.monotonic() + timeout_s
    body = chat_body(model, max_tokens=2)
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=15)
            if answer.status_code == 200:
                return
            last = f"{answer.status_code} {answer.text[:200]}"
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(1)
    raise AssertionError(f"{model} did not answer within {timeout_s}s: {last}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = report.summary_lines()
    if not lines:
        return
    path = report.write(
        {
            "command": report.command_line(),
            "full": is_full(),
            "sizes": sizes().__dict__,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
    )
    terminalreporter.section("reliability")
    for line in lines:
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"report: {path}")
