"""What `python -m deployments.launch` itself says: one line once the app can be used.

`serve run` says "Submitted deploy config successfully." long before any replica has
loaded its model, and nothing after; a user had to poll /healthz to know. Once the
start-up watch (start_watch.py) sees the config's applications all RUNNING, its thread
polls /healthz and prints one line, once, when it answers 200: where, and which models,
each embedding and rerank model with the runtime its replica runs and why (/v1/stats).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from deployments.launch.config_file import applications

# Serve's own defaults when the config has no http_options (ray.serve.config.HTTPOptions).
SERVE_DEFAULT_HOST = "127.0.0.1"
SERVE_DEFAULT_PORT = 8000
MODEL_LISTS = ("embedding_models", "rerank_models", "generation_models")
POLL_S = 0.5
STATS_TIMEOUT_S = 10


def base_url(config: Mapping[str, Any]) -> str:
    """Where the config serves HTTP; a wildcard address is shown as the local one, which
    is where a user on this machine reaches it."""
    options = config.get("http_options") or {}
    host = options.get("host") or SERVE_DEFAULT_HOST
    port = options.get("port") or SERVE_DEFAULT_PORT
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def model_names(config: Mapping[str, Any]) -> list[str]:
    """Every model the config's applications serve, in config order."""
    names: list[str] = []
    for application in applications(config):
        arguments = application.get("args") or {}
        for key in MODEL_LISTS:
            names += [str(model["name"]) for model in arguments.get(key) or [] if "name" in model]
    return names


def model_label(name: str, models_stats: dict[str, Any]) -> str:
    """`name: runtime (why)` for a model whose replica reports a runtime (embedding and
    rerank models), the bare name otherwise."""
    entry = models_stats.get(name)
    replica = entry.get("replica") if isinstance(entry, dict) else None
    runtime = replica.get("runtime") if isinstance(replica, dict) else None
    if not isinstance(runtime, dict) or not runtime.get("runtime"):
        return name
    summary = runtime.get("summary")
    return f"{name}: {runtime['runtime']}" + (f" ({summary})" if summary else "")


def ready_line(url: str, models: list[str], models_stats: dict[str, Any] | None = None) -> str:
    labels = [model_label(name, models_stats or {}) for name in models]
    # A label may hold commas of its own ("fastest of 4 agreeing, measured now").
    listed = ("; " if labels != models else ", ").join(labels) if labels else "none"
    return f"Tributary is ready at {url} (models: {listed})"


def healthz_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def models_stats(url: str) -> dict[str, Any]:
    """`GET /v1/stats`'s per-model part (each replica's runtime and why); empty when it
    does not answer, so the ready line is still said, with names only."""
    try:
        with urllib.request.urlopen(f"{url}/v1/stats", timeout=STATS_TIMEOUT_S) as response:
            models = json.loads(response.read()).get("models")
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return {}
    return models if isinstance(models, dict) else {}


def wait_then_announce(
    url: str,
    models: list[str],
    say: Callable[[str], None],
    healthy: Callable[[str], bool] = healthz_ok,
    poll_s: float = POLL_S,
    stats: Callable[[str], dict[str, Any]] = models_stats,
) -> None:
    """Blocks until /healthz answers 200, then says the ready line. Called once Serve says
    every application runs (launch/start_watch.py's `on_running`)."""
    while not healthy(url):
        time.sleep(poll_s)
    say(ready_line(url, models, stats(url)))


def announcer(config: Mapping[str, Any], say: Callable[[str], None]) -> Callable[[], None]:
    """What says the ready line for `config`, once its applications run."""
    return lambda: wait_then_announce(base_url(config), model_names(config), say)


# What the raylet says when Serve's own shutdown kills its controller while calls to it are
# still open: at every Ctrl-C it printed "Task ServeController.graceful_shutdown failed.
# There are infinite retries remaining, ... killed by `ray.kill`." (and the same for
# listen_for_change). That is Serve stopping as designed, not a fault.
SHUTDOWN_NOISE = ("Task ServeController.", "killed by `ray.kill`")
# The wrappers installed, so that a second call wraps nothing twice.
_QUIET_WRAPPERS: set[int] = set()


def is_shutdown_noise(line: str) -> bool:
    return all(part in line for part in SHUTDOWN_NOISE)


def without_shutdown_noise(data: dict[str, Any]) -> dict[str, Any] | None:
    """A batch of forwarded log lines without the shutdown noise; None if nothing is left."""
    lines = [line for line in data.get("lines", []) if not is_shutdown_noise(line)]
    if not lines:
        return None
    return {**data, "lines": lines}


def quiet_shutdown_noise() -> bool:
    """Filters the noise out of the worker and raylet lines Ray prints in this driver.
    Both of Ray's paths to the console (forwarded worker logs, and error messages pushed
    to the driver, where this line arrives) end in `ray._private.worker.print_worker_logs`;
    Ray has no public switch for this, so it wraps that function. If the private hook is
    missing (another Ray), it changes nothing and says False."""
    try:
        from ray._private import worker
    except ImportError:
        return False
    original = getattr(worker, "print_worker_logs", None)
    if not callable(original) or id(original) in _QUIET_WRAPPERS:
        return callable(original)

    def print_worker_logs(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        kept = without_shutdown_noise(data)
        if kept is not None:
            original(kept, *args, **kwargs)

    _QUIET_WRAPPERS.add(id(print_worker_logs))
    worker.print_worker_logs = print_worker_logs
    return True
