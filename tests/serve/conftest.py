"""Starts the real application once for this folder, through `python -m deployments.launch`
(what `make serve` runs), on a config derived from serve_config.yaml with a free port, a
second, strict copy of MiniLM (`truncate: false`, `accept_token_ids: true`, a memory budget
that its warm-up probe turns into a token ceiling), a third under a tight memory limit, the
demo LLM a second time on the static engine, API keys for three tenants and a small
batch-class queue (so a flood is quick to make), and a small cross-encoder reranker built
into a temporary directory. Stops it with Ctrl-C, as a user would, once this folder's last
test is done; the fixture fails if any process it started outlives that.

The folder's tests that start apps of their own run first (`pytest_collection_modifyitems`),
so that no two apps share the two cores: the shared one, idle, still kept ~18 % of them busy,
and it used to stay up through those tests and the unit tests after."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.server import Server, load_config, running_server
from deployments.core.access.keys import digest
from tests.tiny_models import build_tiny_cross_encoder

MODEL = "all-MiniLM-L6-v2"
STRICT_MODEL = "minilm-strict"
CACHED_MODEL = STRICT_MODEL  # the one model with the result cache on (unique texts in tests)
RERANK_MODEL = "minilm-rerank"  # the default app's bi-encoder reranker
CROSS_MODEL = "tiny-cross-encoder"  # built by the session, random weights
STATIC_LLM = "tiny-llama-static"  # the default app's demo LLM on the static engine
FENCED_MODEL = "minilm-fenced"  # MiniLM whose replica runs under a tight memory limit
FENCED_HEADROOM_MIB = 100
STRICT_BUDGET_MIB = 200  # the strict MiniLM's memory_budget_mib: its warm-up probes memory

# Test keys, known to the test server only as their digests.
ADMIN_KEY = "trib-test-admin"  # tier realtime, every model, no rate limit
BULK_KEY = "trib-test-bulk"  # tier batch, MODEL only
LIMITED_KEY = "trib-test-limited"  # tier normal, 1 request/s with a burst of 2
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
BATCH_QUEUE_ITEMS = 256
BATCH_LEASE_S = 4


def serve_test_config(cross_encoder_dir: Path | None = None) -> dict:
    config = load_config()
    args = config["applications"][0]["args"]
    # The Batch API (its store goes in the server's workdir, bench/server.py): a short
    # lease, so a batch whose dispatcher was killed resumes within seconds.
    args["batches"] = {"lease_s": BATCH_LEASE_S, "poll_s": 0.2}
    # The embedders and the ingress already claim both cores; the rerankers claim none,
    # so they fit (they are idle while the embedding tests run).
    for reranker in args.get("rerank_models", []):
        reranker["deployment"]["ray_actor_options"]["num_cpus"] = 0
        # Two passes side by side (the app's default is one), so the served rerank tests,
        # concurrent clients among them, run that path too.
        reranker["passes_in_flight"] = 2
    if cross_encoder_dir is not None:
        cross = copy.deepcopy(args["rerank_models"][0])
        cross.update(
            name=CROSS_MODEL,
            source=str(cross_encoder_dir),
            backend="cross-encoder",
            torch_threads=1,
        )
        args["rerank_models"].append(cross)
    # The static engine inside Serve too (@serve.batch streaming over batched generate):
    # the same demo weights, no CPU claimed (idle but for its own tests), one thread.
    # No standby replicas: seven models share two cores here; the reliability suite kills
    # the shipped app's serving replica and watches its standby take over.
    for generator in args["generation_models"]:
        generator["standby_replicas"] = 0
    static = copy.deepcopy(args["generation_models"][0])
    static.update(name=STATIC_LLM, engine="static", max_num_seqs=8, torch_threads=1)
    static["deployment"]["ray_actor_options"]["num_cpus"] = 0
    args["generation_models"].append(static)
    strict = copy.deepcopy(args["embedding_models"][0])
    # Also the one model that takes token ids (as a client with MiniLM's own tokenizer sends).
    strict.update(name=STRICT_MODEL, truncate=False, torch_threads=1, accept_token_ids=True)
    # And the one whose token ceiling comes from a memory budget (the warm-up probe).
    strict["memory_budget_mib"] = STRICT_BUDGET_MIB
    strict["deployment"]["ray_actor_options"]["num_cpus"] = 0.5
    args["embedding_models"].append(strict)
    # Large batches of long texts run out of memory for real in this one (memory faults).
    fenced = copy.deepcopy(args["embedding_models"][0])
    fenced.update(name=FENCED_MODEL, torch_threads=1, memory_limit_mib=FENCED_HEADROOM_MIB)
    fenced["deployment"]["ray_actor_options"]["num_cpus"] = 0
    # Its arenas are capped by the app itself (config/allocator.py), as for any fenced model.
    args["embedding_models"].append(fenced)
    args["auth"] = {
        "tenants": [
            {"name": "admin", "tier": "realtime", "key_sha256": [digest(ADMIN_KEY)]},
            {
                "name": "bulk",
                "tier": "batch",
                "models": [MODEL],
                "key_sha256": [digest(BULK_KEY)],
            },
            {
                "name": "limited",
                "key_sha256": [digest(LIMITED_KEY)],
                "requests_per_s": 1,
                "burst_requests": 2,
            },
        ]
    }
    # Seven models share two cores here, so a burst of 64 requests at the normal class's
    # 500 ms target is more than this server answers in time, and admission by predicted
    # wait, where it is on, rightly refuses part of it. These tests check what bursts
    # get back, not admission: the reliability suite checks that on the shipped app, and
    # tests/integration/test_predicted_wait.py its rules.
    args["ingress"]["admission"]["predict_wait"] = False
    # One ingress replica: these tests send realtime and other classes alike and read one
    # replica's /v1/stats after. The replica kept for realtime is tested on the shipped app
    # (tests/reliability/test_overload.py) and on the real HAProxy (tests/parts).
    args["ingress"]["realtime_replica"] = False
    args["ingress"]["deployment"]["num_replicas"] = 1
    batch = args["ingress"]["admission"]["batch"]
    batch.update(max_queued_items=BATCH_QUEUE_ITEMS, shed_above_queued_items=BATCH_QUEUE_ITEMS)
    # The result cache on one model only: the others' tests count what reaches their
    # replicas (floods, memory faults, cost fits), which a cache would absorb.
    args["cache"] = {"enabled": True, "models": [CACHED_MODEL], "max_bytes": 16 * 1024 * 1024}
    return config


def uses_the_shared_app(item: pytest.Item) -> bool:
    """Whether the test's `server`, if any, is this folder's shared app (a module's own
    `server` fixture is defined in that module, so its baseid names the file)."""
    info = getattr(item, "_fixtureinfo", None)
    definitions = info.name2fixturedefs.get("server") if info is not None else None
    return bool(definitions) and not definitions[-1].baseid.endswith(".py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In this folder, the tests that start apps of their own (or none) before the ones on
    the shared app; the order within each group stays."""
    folder = Path(__file__).parent
    places = [i for i, item in enumerate(items) if Path(str(item.fspath)).parent == folder]
    ordered = sorted((items[i] for i in places), key=uses_the_shared_app)
    for place, item in zip(places, ordered, strict=True):
        items[place] = item


@pytest.fixture(scope="package")
def cross_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("models") / "cross")


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory, cross_encoder_dir: Path) -> Iterator[Server]:
    config = serve_test_config(cross_encoder_dir)
    with running_server(config, tmp_path_factory.mktemp("serve")) as server:
        yield server
