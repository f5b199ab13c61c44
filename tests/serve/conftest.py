"""Starts the real application once per session, through `python -m deployments.launch`
(what `make serve` runs), on a config derived from serve_config.yaml with a free port and
a second, strict copy of MiniLM (`truncate: false`). Stops it with Ctrl-C, as a user
would; the fixture fails if any process it started outlives that."""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest

from bench.server import Server, load_config, running_server

MODEL = "all-MiniLM-L6-v2"
STRICT_MODEL = "minilm-strict"


def serve_test_config() -> dict:
    config = load_config()
    args = config["applications"][0]["args"]
    strict = copy.deepcopy(args["embedding_models"][0])
    strict.update(name=STRICT_MODEL, truncate=False, torch_threads=1)
    strict["deployment"]["ray_actor_options"]["num_cpus"] = 0.5
    args["embedding_models"].append(strict)
    return config


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with running_server(serve_test_config(), tmp_path_factory.mktemp("serve")) as server:
        yield server
