"""How many KV-cache tokens and sequences a generation replica takes, from memory.

Every token in flight holds a key and a value vector per layer and per KV head; so a byte
budget divides into tokens exactly, and the tokens into sequences of the size a request
usually asks for. Where the config names `kv_cache_tokens` or `max_num_seqs`, that wins; where
it leaves them out, the replica derives them here at start from the free device memory (on a
GPU) or a configured memory budget (on a CPU), and reports which.
"""

from __future__ import annotations

from dataclasses import dataclass

# Bounds on a derived size: at least a few pages, at most what one replica's scheduler can
# sensibly track in one step.
MIN_PAGES = 4
MAX_DERIVED_TOKENS = 1 << 20
MAX_DERIVED_SEQS = 256


@dataclass(frozen=True)
class KvShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class KvBudget:
    kv_cache_tokens: int
    max_num_seqs: int
    source: str  # where each figure came from, for /v1/stats and the start-up log

    def report(self) -> dict[str, int | str]:
        return {
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_num_seqs": self.max_num_seqs,
            "source": self.source,
        }


def derive(
    shape: KvShape,
    budget_bytes: int | None,
    budget_source: str,
    page_size: int,
    tokens_per_sequence: int,
    kv_cache_tokens: int | None,
    max_num_seqs: int | None,
) -> KvBudget:
    """The configured figures where given; the rest from `budget_bytes`."""
    parts = []
    tokens = kv_cache_tokens
    if tokens is None:
        if budget_bytes is None:
            raise ValueError("kv_cache_tokens is not set and there is no memory budget")
        pages = budget_bytes // (shape.bytes_per_token * page_size)
        tokens = min(max(pages, MIN_PAGES) * page_size, MAX_DERIVED_TOKENS)
        parts.append(
            f"kv_cache_tokens from {budget_source} ({shape.bytes_per_token} bytes per token)"
        )
    else:
        parts.append("kv_cache_tokens as configured")
    seqs = max_num_seqs
    if seqs is None:
        seqs = min(max(tokens // max(tokens_per_sequence, 1), 1), MAX_DERIVED_SEQS)
        parts.append(f"max_num_seqs = kv_cache_tokens / {tokens_per_sequence} tokens a sequence")
    else:
        parts.append("max_num_seqs as configured")
    return KvBudget(tokens, seqs, "; ".join(parts))
