"""The launcher's ready line: where and what, said once, and only when the apps run and
/healthz answers."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from deployments.launch import output as launch_output

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_config_is_announced_at_its_address_with_every_model() -> None:
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    line = launch_output.ready_line(
        launch_output.base_url(config), launch_output.model_names(config)
    )
    assert line == (
        "Tributary is ready at http://127.0.0.1:8000 "
        "(models: all-MiniLM-L6-v2, minilm-rerank, tiny-llama-demo)"
    )


@pytest.mark.parametrize(
    ("options", "url"),
    [
        (None, "http://127.0.0.1:8000"),
        ({"port": 9000}, "http://127.0.0.1:9000"),
        ({"host": "0.0.0.0", "port": 80}, "http://127.0.0.1:80"),
        ({"host": "::1", "port": 8000}, "http://[::1]:8000"),
        ({"host": "10.0.0.5"}, "http://10.0.0.5:8000"),
    ],
)
def test_the_url_is_where_a_user_here_reaches_it(options: dict | None, url: str) -> None:
    config = {} if options is None else {"http_options": options}
    assert launch_output.base_url(config) == url


def test_a_config_without_models_says_none() -> None:
    assert launch_output.ready_line("http://h:1", []).endswith("(models: none)")


def test_nothing_is_said_until_healthz_answers() -> None:
    answers = iter([False, False, True])
    said: list[str] = []
    launch_output.wait_then_announce(
        "http://h:1", ["m"], said.append, lambda url: next(answers), 0, lambda url: {}
    )
    assert said == ["Tributary is ready at http://h:1 (models: m)"]
    assert next(answers, "asked no more") == "asked no more"


def test_each_encoder_model_says_its_runtime_and_why() -> None:
    stats = {
        "all-MiniLM-L6-v2": {
            "replica": {
                "runtime": {
                    "runtime": "openvino-bf16",
                    "summary": "fastest of 5 agreeing, measured now",
                    "decided": "measured",
                }
            }
        },
        "minilm-rerank": {
            "replica": {"runtime": {"runtime": "torch-fp32", "summary": "configured"}}
        },
        "tiny-llama-demo": {"replica": {"engine": "continuous"}},
        "broken": {"replica": {"error": "no answer: TimeoutError"}},
    }
    models = ["all-MiniLM-L6-v2", "minilm-rerank", "tiny-llama-demo", "broken", "missing"]
    said: list[str] = []
    launch_output.wait_then_announce(
        "http://h:1", models, said.append, lambda url: True, 0, lambda url: stats
    )
    assert said == [
        "Tributary is ready at http://h:1 (models: "
        "all-MiniLM-L6-v2: openvino-bf16 (fastest of 5 agreeing, measured now); "
        "minilm-rerank: torch-fp32 (configured); tiny-llama-demo; broken; missing)"
    ]


def test_stats_that_do_not_answer_leave_the_names(health_server: str) -> None:
    assert launch_output.models_stats(health_server) == {}  # 404
    assert launch_output.models_stats("http://127.0.0.1:1") == {}


class Health(http.server.BaseHTTPRequestHandler):
    status = 503

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_healthz_ok_is_200_only(health_server: str) -> None:
    Health.status = 503
    assert not launch_output.healthz_ok(health_server)
    Health.status = 200
    assert launch_output.healthz_ok(health_server)
    assert not launch_output.healthz_ok("http://127.0.0.1:1")


GRACEFUL = (
    "Task ServeController.graceful_shutdown failed. There are infinite retries remaining, so "
    "the task will be retried. Error: The actor is dead because it was killed by `ray.kill`."
)
LISTEN = GRACEFUL.replace("graceful_shutdown", "listen_for_change")


def test_serves_own_shutdown_lines_are_dropped_and_every_other_line_kept() -> None:
    data = {"pid": "raylet", "is_err": True, "lines": [GRACEFUL, "a real warning", LISTEN]}
    assert launch_output.without_shutdown_noise(data) == {**data, "lines": ["a real warning"]}
    assert launch_output.without_shutdown_noise({**data, "lines": [GRACEFUL, LISTEN]}) is None
    # A controller that dies any other way is still reported.
    crashed = "Task ServeController.listen_for_change failed. Error: the worker died unexpectedly"
    assert launch_output.without_shutdown_noise({**data, "lines": [crashed]}) is not None


def test_the_filter_sits_where_ray_prints_both_forwarded_logs_and_pushed_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from ray._private import worker

    saved = worker.print_worker_logs
    try:
        assert launch_output.quiet_shutdown_noise()
        assert launch_output.quiet_shutdown_noise()  # a second call wraps nothing twice
        # The path of an error message pushed to the driver (where the line arrives)...
        worker.print_to_stdstream(
            {"pid": "raylet", "is_err": False, "lines": [GRACEFUL]}, ignore_prefix=False
        )
        # ...and of a forwarded worker log.
        worker.print_to_stdstream(
            {"pid": 42, "is_err": False, "lines": ["model ready", LISTEN]}, ignore_prefix=True
        )
    finally:
        worker.print_worker_logs = saved
    printed = capsys.readouterr().out
    assert "model ready" in printed
    assert "ServeController" not in printed
