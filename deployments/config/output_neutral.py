"""Which settings of a model's config change what it returns: all of them, unless marked.

A field typed `OutputNeutral[...]` changes how a model is run, sized or admitted, never its
outputs (threads, memory fences, batch sizes, request limits). The result cache leaves
exactly those out of its key, so a setting added later is in the key, and changing it
misses rather than serves a stale result, until someone marks it.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel


class _OutputNeutralMark:
    def __repr__(self) -> str:
        return "OUTPUT_NEUTRAL"


OUTPUT_NEUTRAL = _OutputNeutralMark()

T = TypeVar("T")
OutputNeutral = Annotated[T, OUTPUT_NEUTRAL]

# pydantic's `exclude` argument: True drops a field; a mapping reaches into a nested model
# (by field name), a list or tuple (by index) or a dict (by key).
Exclusion = dict[Any, Any]


def is_output_neutral(model: type[BaseModel], field: str) -> bool:
    return any(mark is OUTPUT_NEUTRAL for mark in model.model_fields[field].metadata)


def output_neutral_fields(model: BaseModel) -> Exclusion:
    """What to exclude from `model.model_dump_json` to keep only the settings that change
    outputs: a marked field whole; inside an unmarked field that holds models (one, or a
    list, tuple or dict of them), their own marked fields."""
    exclude: Exclusion = {}
    for name in type(model).model_fields:
        if is_output_neutral(type(model), name):
            exclude[name] = True
        elif inner := _within(getattr(model, name)):
            exclude[name] = inner
    return exclude


def _within(value: Any) -> Exclusion:
    # By the value, not the annotation, so a union of models finds the one it holds.
    if isinstance(value, BaseModel):
        return output_neutral_fields(value)
    if isinstance(value, list | tuple):
        return {i: inner for i, item in enumerate(value) if (inner := _within(item))}
    if isinstance(value, dict):
        return {key: inner for key, item in value.items() if (inner := _within(item))}
    return {}
