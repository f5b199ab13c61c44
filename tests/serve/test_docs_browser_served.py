"""`/docs` and `/redoc` render in a real headless browser with every host but the server
unresolvable (issue 17): the pages, their scripts and the OpenAPI document all come from the
app itself, so they work on a machine with no internet."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.serve.conftest import Server
from tests.serve.test_status_page_served import CHROMIUM, FLAGS, require_chromium

# Any name but the server's address fails to resolve, as on a machine with no internet.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
ROUTES = ("/v1/embeddings", "/v1/rerank", "/v1/chat/completions", "/healthz")


@pytest.fixture(scope="session", autouse=True)
def _chromium() -> None:
    # Session scope and autouse: checked before the server starts, so a skip costs nothing.
    require_chromium()


def render_offline(url: str, profile: Path) -> str:
    require_chromium()
    flags = [f for f in FLAGS if not f.startswith("--virtual-time-budget")]
    command = [CHROMIUM, *flags, "--virtual-time-budget=10000", OFFLINE]
    browser = subprocess.Popen(
        [*command, f"--user-data-dir={profile}", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = browser.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(browser.pid, signal.SIGKILL)
        browser.communicate()
        raise
    assert browser.returncode == 0, out[-2000:]
    return out


def test_swagger_ui_renders_every_route_offline(server: Server, tmp_path: Path) -> None:
    dom = render_offline(f"{server.url}/docs", tmp_path / "profile")
    rendered = set(re.findall(r'data-path="([^"]+)"', dom))
    assert set(ROUTES) <= rendered, rendered
    assert "Unable to render" not in dom


def test_redoc_renders_every_route_offline(server: Server, tmp_path: Path) -> None:
    dom = render_offline(f"{server.url}/redoc", tmp_path / "profile")
    assert "Something went wrong" not in dom
    assert all(r in dom for r in ROUTES), [r for r in ROUTES if r not in dom]
