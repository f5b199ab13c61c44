"""A replica that cannot start (issue 31's start-up faults): `python -m deployments.launch`
says the replica's error while Serve retries it, and once Serve gives up it says the
traceback and exits with status 4, instead of waiting silently for ever. Seen first on a
GPU machine whose transformers was too old for the LLM engine; here the embedder's weights
are simply missing."""

from __future__ import annotations

import time
from pathlib import Path

from bench.server import launch, load_config
from deployments.launch.failed_start import EXIT_FAILED_START
from tests.serve.test_unplaceable_served import output_once_exited, own_side_ports


def embedder_without_weights(empty: Path) -> dict:
    """The default app's embedder alone, its source a directory with no model in it: the
    config is valid, and the replica's constructor fails loading it."""
    config = load_config()
    args = config["applications"][0]["args"]
    for key in ("rerank_models", "generation_models"):
        args.pop(key)
    args["embedding_models"][0]["source"] = str(empty)
    return config


def test_a_replica_that_cannot_start_ends_the_launch_with_its_error(tmp_path: Path) -> None:
    empty = tmp_path / "no-model-here"
    empty.mkdir()
    started = time.monotonic()
    # Serve tries a replica 3 times by default; 2 still shows a retry announced and the
    # giving up, ~20 s sooner.
    environment = {**own_side_ports(), "RAY_SERVE_MAX_PER_REPLICA_RETRY_COUNT": "2"}
    server = launch(embedder_without_weights(empty), tmp_path, [], environment=environment)
    output = output_once_exited(server, EXIT_FAILED_START, timeout_s=240)
    assert "tributary/embed-all-MiniLM-L6-v2: a replica failed to start: " in output
    assert "; Serve tries 1 more time(s)" in output
    assert "Serve gave up starting the app. Serve says:" in output
    assert str(empty) in output  # the error names what it could not load
    assert "a deployment failed to start (above: Serve's error)" in output
    print(f"gave up in {time.monotonic() - started:.1f} s")
