"""The /status page in a real headless browser (Debian's chromium) against the live
server: its script fetched /v1/stats and rendered the live figures into the table."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import AUTH, CACHED_MODEL, MODEL, Server

# `make test` installs Debian's chromium when it is missing and it may (root, apt-get);
# TRIBUTARY_CHROMIUM names another build.
CHROMIUM = os.environ.get("TRIBUTARY_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Virtual time runs the page's timers and waits for its fetches, then the DOM is
    # dumped: enough for the first render and a refresh.
    "--virtual-time-budget=5000",
    "--dump-dom",
]


class Rows(HTMLParser):
    """Cells of the status table by (model, class): {column class: text}."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[tuple[str, str], dict[str, str]] = {}
        self.versions: dict[tuple[str, str], dict[str, str]] = {}  # (model, version)
        self.cache: dict[str, dict[str, str]] = {}  # model -> its cache row
        self.batches: dict[str, dict[str, str]] = {}  # batch id ("" none) -> its row
        self.device: dict[tuple[str, str], dict[str, str]] = {}  # (model, class)
        self.state = ""
        self._row: dict[str, str] | None = None
        self._cell: str | None = None
        self._in_state = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "tr" and found.get("data-model"):
            self._row = self.rows[(found["data-model"] or "", found["data-class"] or "")] = {}
        elif tag == "tr" and found.get("data-device-of"):
            key = (found["data-device-of"] or "", found.get("data-class") or "")
            self._row = self.device[key] = {}
        elif tag == "tr" and found.get("data-cache-of"):
            self._row = self.cache[found["data-cache-of"] or ""] = {}
        elif tag == "tr" and "data-batch-of" in found:
            self._row = self.batches[found["data-batch-of"] or ""] = {}
        elif tag == "tr" and found.get("data-version-of"):
            key = (found["data-version-of"] or "", found.get("data-version") or "")
            self._row = self.versions[key] = {}
        elif tag == "td" and self._row is not None:
            self._cell = found.get("class") or ""
        self._in_state = tag == "p" and found.get("id") == "state"

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None
        self._cell = None
        self._in_state = False

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._cell:
            self._row[self._cell] = data
        if self._in_state:
            self.state += data


def require_chromium() -> None:
    """Skip without a browser, with the reason and the remedy; but in CI (CI=true), which
    runs as root and installs it, a missing browser is a failure, not a skip."""
    if shutil.which(CHROMIUM):
        return
    reason = (
        f"{CHROMIUM} is missing: installing it needs root and apt-get (`sudo make browser`), "
        "or set TRIBUTARY_CHROMIUM to a chromium binary"
    )
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def _chromium() -> None:
    # Session scope and autouse: checked before the server starts, so a skip costs nothing.
    require_chromium()


def render(url: str, profile: Path) -> str:
    require_chromium()
    command = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", url]
    browser = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its helpers too go on a timeout
    )
    try:
        out, _ = browser.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(browser.pid, signal.SIGKILL)
        browser.communicate()
        raise
    assert browser.returncode == 0, out[-2000:]
    return out


def test_the_status_page_renders_live_figures_in_a_browser(server: Server, tmp_path: Path) -> None:
    for _ in range(3):
        response = httpx.post(
            f"{server.url}/v1/embeddings",
            json={"model": MODEL, "input": ["status page check", "second text"]},
            headers={**AUTH, "X-Priority": "batch"},
            timeout=60,
        )
        assert response.status_code == 200
    for _ in range(2):  # the second is a hit in the cached model's cache
        cached = {"model": CACHED_MODEL, "input": "the status page's cached text"}
        response = httpx.post(f"{server.url}/v1/embeddings", json=cached, headers=AUTH, timeout=60)
        assert response.status_code == 200
    served = httpx.get(f"{server.url}/v1/stats", timeout=30).json()
    sent = served["models"][MODEL]["classes"]["batch"]["requests"]
    assert sent >= 3

    rows = Rows()
    rows.feed(render(f"{server.url}/status", tmp_path / "profile"))

    assert rows.state.startswith("updated"), rows.state
    batch = rows.rows[(MODEL, "batch")]
    # The page shows the server's own count (at least what we had seen just before).
    assert int(batch["requests"]) >= sent
    assert float(batch["p50_ms"]) > 0 and float(batch["p99_ms"]) >= float(batch["p50_ms"])
    assert float(batch["mean_batch_size"]) >= 1
    # Every configured model and class has its row, the generation model's too.
    classes = ("realtime", "normal", "batch")
    assert {(MODEL, c) for c in classes} <= set(rows.rows)
    assert {("tiny-llama-demo", c) for c in classes} <= set(rows.rows)
    # The versions table: each model's one version, ready, with all of its traffic.
    version = rows.versions[(MODEL, "1")]
    assert version["state"] == "ready" and version["share"] == "100.0 %"
    # The result cache's table: the one model with the cache on, with its counts.
    assert set(rows.cache) == {CACHED_MODEL}
    assert int(rows.cache[CACHED_MODEL]["hits"]) >= 1
    # The Batch API's table: this replica's dispatcher, idle or running one batch.
    assert len(rows.batches) == 1
    # The shared device's table: the batch-class passes took their turns.
    device = rows.device[(MODEL, "batch")]
    assert int(device["device_turns"]) >= 1, device
    assert device["share"].endswith("%") and float(device["device_wait_ms"]) >= 0
    assert {("tiny-llama-demo", c) for c in classes} <= set(rows.device)
