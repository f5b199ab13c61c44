"""A cross-encoder reranker: query and document read together, one logit per pair.

Loaded with sentence-transformers' `CrossEncoder` from a local directory (a real checkpoint
such as a BGE or MiniLM reranker saved locally, or the small one the tests build); batches
are built from token ids here so the deployment can chunk documents by tokens and budget
batches by their padded length. The forward pass is a swappable `forward`, as for the
embedder: torch by default, or another runtime running the same graph.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import CrossEncoder

from deployments.backends.encoders.pair_scorer import Pair
from deployments.backends.encoders.sentence_embedder import SAMPLE_TEXTS
from deployments.backends.runtimes.build import Features, Forward, TorchForward
from deployments.core.relevance import ScoreKind


class CrossEncoderScorer:
    score_kind: ScoreKind = "logit"

    def __init__(
        self, model_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        encoder = CrossEncoder(str(model_dir), device=device, local_files_only=True)
        if encoder.num_labels != 1:
            raise ValueError(
                f"{model_dir} has {encoder.num_labels} labels; a reranker has exactly one"
            )
        self.model = encoder.transformers_model
        self.model.eval()
        if dtype != torch.float32:
            self.model.to(dtype)
        self.device = device
        self.tokenizer = encoder.tokenizer
        self.max_tokens = int(encoder.get_max_seq_length() or 512)
        self._template = _pair_template(self.tokenizer)
        self._pad_id = int(self.tokenizer.pad_token_id or 0)
        self._needs_token_types = "token_type_ids" in self.tokenizer.model_input_names
        self.input_names = ["input_ids", "attention_mask"]
        if self._needs_token_types:
            self.input_names.append("token_type_ids")
        self.forward: Forward = TorchForward(self.graph(), device, dtype, copy=False)

    def graph(self) -> torch.nn.Module:
        """The model as one module over plain tensors, returning one logit per pair."""
        return _LogitGraph(self.model, self.input_names)

    def sample(self, size: int) -> Features:
        """Features of `size` query-document pairs, for measuring runtimes."""
        texts = self.tokenize(list(SAMPLE_TEXTS))
        n = len(texts)
        return self.features([(texts[i % n], texts[(i * 7 + 3) % n]) for i in range(size)])

    @property
    def _specials(self) -> int:
        return sum(len(part) for part in self._template)

    @property
    def max_query_tokens(self) -> int:
        # At most half the window, so a long query still leaves room for the document.
        return (self.max_tokens - self._specials) // 2

    def doc_room(self, query_tokens: int) -> int:
        return self.max_tokens - self._specials - query_tokens

    def pair_tokens(self, query_tokens: int, doc_tokens: int) -> int:
        return query_tokens + doc_tokens + self._specials

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        encoded = self.tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)
        return [list(ids) for ids in encoded["input_ids"]]

    def features(self, pairs: list[Pair]) -> Features:
        start, middle, end = self._template
        rows = [[*start, *q, *middle, *d, *end] for q, d in pairs]
        longest = max(len(row) for row in rows)
        input_ids = np.full((len(rows), longest), self._pad_id, dtype=np.int64)
        attention = np.zeros((len(rows), longest), dtype=np.int64)
        token_types = np.zeros((len(rows), longest), dtype=np.int64)
        for i, (row, (query, _)) in enumerate(zip(rows, pairs, strict=True)):
            input_ids[i, : len(row)] = row
            attention[i, : len(row)] = 1
            # The second segment (document and its closing tokens) has type 1.
            token_types[i, len(start) + len(query) + len(middle) : len(row)] = 1
        features = {"input_ids": input_ids, "attention_mask": attention}
        if self._needs_token_types:
            features["token_type_ids"] = token_types
        return features

    def score(self, pairs: list[Pair]) -> np.ndarray:
        return np.asarray(self.forward(self.features(pairs)), dtype=np.float32)


class _LogitGraph(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, input_names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *tensors: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        features = dict(zip(self.input_names, tensors, strict=False)) | named
        return self.model(**features).logits[:, 0]


def _pair_template(tokenizer: Any) -> tuple[list[int], list[int], list[int]]:
    """The special tokens before the query, between query and document, and after it,
    learnt by encoding one known pair with and without them."""
    first, second = "hello", "world"
    plain_a = list(tokenizer(first, add_special_tokens=False)["input_ids"])
    plain_b = list(tokenizer(second, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(first, second)["input_ids"])
    for a in range(len(full)):
        if full[a : a + len(plain_a)] != plain_a:
            continue
        after_a = a + len(plain_a)
        for b in range(after_a, len(full)):
            if full[b : b + len(plain_b)] == plain_b:
                return full[:a], full[after_a:b], full[b + len(plain_b) :]
    raise ValueError("cannot locate a query and a document inside the pair's special tokens")
