"""Which completions the result cache may keep, and what identifies one.

Only greedy decoding is deterministic: a sampled completion is a draw, and answering the
next identical request with the same draw would be wrong (with a seed it would be right,
but only on the same engine, batch and build; not worth promising). Greedy is the engine's
own definition, shared with `backends/generation/sampling.py`: a temperature below
`GREEDY_BELOW_TEMPERATURE` takes the argmax at every step, and top-p and the seed are
never read.

The request's part of a key is every field of the job the replica receives except those
that cannot change a greedy result: the request id, and temperature, top-p and seed. A
field added to `GenerationJob` later is therefore in the key by default (it misses rather
than answers wrongly). The model's part (name, version, settings) comes from the ingress.
Whatever the schema refuses (n > 1, logprobs, penalties, echo, best_of) never reaches a
job, so it needs no rule here.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from deployments.core.protocol import GenerationJob

# Below this, sampling at temperature t is greedy to within float32 precision (logits a
# millionth apart are already one-hot), and dividing by t is where overflow starts.
GREEDY_BELOW_TEMPERATURE = 1e-6

# In every generation key: a change to what goes into it gets new keys.
GENERATION_KEY_FORMAT = "generate-v1"

# How the answer travels, not what it is: a whole and a streamed request share an entry.
NOT_IN_KEY = frozenset({"request_id", "whole"})
# Read only when sampling; a greedy row ignores them (sampling.py, `sample_rows`).
SAMPLING_ONLY = frozenset({"temperature", "top_p", "seed"})


def is_greedy(temperature: float) -> bool:
    # `not >=` rather than `<`: a NaN temperature is greedy too, never a division.
    return not temperature >= GREEDY_BELOW_TEMPERATURE


def cacheable(job: GenerationJob) -> bool:
    """Whether the job's result is determined by its fields and the model alone."""
    return is_greedy(job.temperature)


def job_content(job: GenerationJob) -> bytes:
    """The bytes of a greedy job that decide its result: the prompt or the messages (the
    chat template is the model's, so its version and source stand for it), max_tokens,
    the stop sequences, and any field added later."""
    fields: dict[str, Any] = {
        f.name: getattr(job, f.name)
        for f in dataclasses.fields(job)
        if f.name not in NOT_IN_KEY and f.name not in SAMPLING_ONLY
    }
    # ASCII-escaped: a lone surrogate (valid in a JSON string) must not fail the key;
    # `repr` for a value JSON has no type for, so a field added later cannot either.
    compact = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=repr)
    return compact.encode()
