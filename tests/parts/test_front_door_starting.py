"""While Serve starts, HAProxy runs before the app has a route, and Serve's config then
sends every request to a plain-text 404. The front door turns that into the API's 503
not_ready, on the config Serve itself generates, checked with the real HAProxy (no Ray);
once an app route exists, the config keeps Serve's 404 for paths no app serves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.parts.front_door_support import (
    exchange,
    free_port,
    front_door,
    running_haproxy,
    wrapper_environment,
)


def serve_config_with(directory: Path, port: int, *, routed: bool) -> Path:
    """Serve's own config with no app yet, or with one app route at `/`, on free ports."""
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig
    from ray.serve.config import HTTPOptions

    config = HAProxyConfig(
        socket_path=str(directory / "admin.sock"),
        server_state_base=str(directory),
        server_state_file=str(directory / "server-state"),
        metrics_socket_path=str(directory / "metrics.sock"),
        http_options=HTTPOptions(host="127.0.0.1", port=port),
        stats_port=free_port(),
        metrics_port=free_port(),
    )
    backends = {}
    if routed:
        server = ServerConfig(name="r1", host="127.0.0.1", port=1)
        backends["default"] = BackendConfig(
            name="default", path_prefix="/", servers=[server], app_name="default"
        )
    path = directory / "haproxy.cfg"
    HAProxyApi(config, backends, config_file_path=str(path))._generate_config_file_internal()
    return path


def test_with_no_route_the_default_backend_answers_not_ready_in_place_of_its_404(
    tmp_path: Path,
) -> None:
    original = serve_config_with(tmp_path, free_port(), routed=False).read_text()
    assert not [line for line in original.splitlines() if line.strip().startswith("use_backend")]
    assert "status 404" in original
    patched = front_door.patch_config(original, front_door.error_files())
    backend = patched.split("\nbackend default_backend\n", 1)[1].splitlines()
    assert backend[0].split() == [
        "http-request",
        "return",
        "errorfile",
        str(front_door.ERROR_DIR / "503.http"),
    ]
    assert "status 404" not in "\n".join(backend[1:]).split("\nbackend ", 1)[0]


def test_with_an_app_route_serves_404_stands(tmp_path: Path) -> None:
    original = serve_config_with(tmp_path, free_port(), routed=True).read_text()
    patched = front_door.patch_config(original, front_door.error_files())
    backend = patched.split("\nbackend default_backend\n", 1)[1].splitlines()
    assert "status 404" in backend[0]
    assert "503.http" not in backend[0]


@pytest.mark.parametrize("request_line", ["GET /healthz", "POST /v1/embeddings"])
def test_haproxy_answers_json_not_ready_while_no_app_has_a_route(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request_line: str
) -> None:
    environment = wrapper_environment(monkeypatch)
    port = free_port()
    config = serve_config_with(tmp_path, port, routed=False)
    raw = f"{request_line} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()
    with running_haproxy(config, port, environment):
        status, headers, body = exchange(port, raw)
    assert status == 503
    assert headers["content-type"] == "application/json"
    assert int(headers["retry-after"]) >= 1
    assert json.loads(body)["error"]["code"] == "not_ready"
