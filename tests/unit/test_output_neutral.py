"""The result cache's key takes every setting of a model's config but the ones marked
`OutputNeutral`: a new field is in the key unless marked, nested models included."""

from __future__ import annotations

from pydantic import BaseModel

from deployments.config import (
    CacheConfig,
    EmbeddingModelConfig,
    GenerationModelConfig,
    RerankModelConfig,
)
from deployments.config.output_neutral import (
    OutputNeutral,
    is_output_neutral,
    output_neutral_fields,
)
from deployments.config.strict import StrictModel
from deployments.ingress.cache.item_cache import ItemCaches

# The hand-kept list the marks replaced: these settings stay out of the key, and no other
# does, so every key of a config that was valid before is the same bytes.
LEFT_OUT_BEFORE = frozenset(
    {
        "name",
        "version",
        "batching",
        "deployment",
        "torch_threads",
        "cache_dir",
        "gpu_memory_fraction",
        "memory_limit_mib",
        "runtime_min_agreement",
        "passes_in_flight",
        "max_inputs",
        "accept_token_ids",
        "max_documents",
        "max_chunk_passes",
        "max_num_seqs",
        "kv_cache_tokens",
        "kv_cache_memory_fraction",
        "kv_cache_memory_mib",
        "page_size",
        "static_batch_wait_s",
        "default_max_tokens",
        "max_tokens_limit",
        "max_stop_sequences",
        "queue",
    }
)

MODEL_CLASSES: tuple[type[BaseModel], ...] = (
    EmbeddingModelConfig,
    RerankModelConfig,
    GenerationModelConfig,
)


# Settings added since, that change how a model is run and never what it returns: out of
# the key too, so every key of an older config stays the same bytes.
NEUTRAL_SINCE = frozenset({"device_turns", "device_arbiter", "realtime_lane", "standby_replicas"})


def marked(model: type[BaseModel]) -> set[str]:
    return {name for name in model.model_fields if is_output_neutral(model, name)}


def fingerprint(model: EmbeddingModelConfig) -> object:
    # The config's part of every key: (format, name, version, fingerprint, scope).
    return ItemCaches(CacheConfig()).namespace(model, None, ())[3]


def test_every_setting_left_out_before_is_marked_and_no_other() -> None:
    every_field: set[str] = set()
    for model in MODEL_CLASSES:
        every_field |= set(model.model_fields)
        expected = (LEFT_OUT_BEFORE | NEUTRAL_SINCE) & set(model.model_fields)
        assert marked(model) == expected, model.__name__
    assert every_field >= LEFT_OUT_BEFORE | NEUTRAL_SINCE  # no name of the lists is stale


def test_keys_of_todays_configs_are_unchanged() -> None:
    configs = [
        EmbeddingModelConfig(name="e", source="package:x"),
        EmbeddingModelConfig(
            name="e",
            version="7",
            source="/models/e",
            truncate=False,
            max_inputs=5,
            torch_threads=3,
            runtime="auto",
            dtype="float32",
        ),
        RerankModelConfig(name="r", source="package:x", backend="cross-encoder", doc_score="mean"),
        GenerationModelConfig(name="g", source="demo:tiny-llama", max_num_seqs=None),
    ]
    for config in configs:
        # What the key held before: the fields added since did not exist.
        old = config.model_dump_json(exclude=set(LEFT_OUT_BEFORE | NEUTRAL_SINCE))
        assert config.model_dump_json(exclude=output_neutral_fields(config)) == old


def test_an_unmarked_new_field_enters_the_key_and_a_marked_one_does_not() -> None:
    class WithPooling(EmbeddingModelConfig):
        pooling: str = "mean"
        queue_hint: OutputNeutral[int] = 0

    base = WithPooling(name="e", source="package:x")
    assert fingerprint(base) != fingerprint(base.model_copy(update={"pooling": "cls"}))
    assert fingerprint(base) == fingerprint(base.model_copy(update={"queue_hint": 9}))
    assert fingerprint(base) == fingerprint(base.model_copy(update={"max_inputs": 9}))


class Stage(StrictModel):
    kind: str = "pool"
    workers: OutputNeutral[int] = 1


class Pipeline(StrictModel):
    head: Stage = Stage()
    stages: list[Stage] = [Stage(), Stage()]
    named: dict[str, Stage] = {"a": Stage()}
    spare: OutputNeutral[Stage] = Stage()


def test_marks_inside_nested_models_are_left_out() -> None:
    pipeline = Pipeline()
    assert output_neutral_fields(pipeline) == {
        "head": {"workers": True},
        "stages": {0: {"workers": True}, 1: {"workers": True}},
        "named": {"a": {"workers": True}},
        "spare": True,
    }
    kept = pipeline.model_dump_json(exclude=output_neutral_fields(pipeline))
    assert kept == '{"head":{"kind":"pool"},"stages":[{"kind":"pool"},{"kind":"pool"}],' + (
        '"named":{"a":{"kind":"pool"}}}'
    )
    busier = Pipeline(head=Stage(workers=8), stages=[Stage(workers=2)], spare=Stage(kind="x"))
    other = Pipeline(head=Stage(kind="mean"))
    assert busier.model_dump_json(exclude=output_neutral_fields(busier)) == (
        '{"head":{"kind":"pool"},"stages":[{"kind":"pool"}],"named":{"a":{"kind":"pool"}}}'
    )
    assert other.model_dump_json(exclude=output_neutral_fields(other)) != kept
