"""A sentence-transformers embedding model behind three calls: tokenize, fit, embed.

The forward pass is a swappable `forward` (features in, vectors out): torch by default,
or another runtime (`runtimes`, chosen by `runtime_select`) running the same graph.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from deployments.backends.runtimes.build import Features, Forward, TorchForward
from deployments.core.batching.token_window import TokenWindow

# Sentences of varied length, for `runtime: auto`'s agreement check and timing.
SAMPLE_TEXTS = (
    "The cat sat on the mat.",
    "How do I reset my password if I no longer have access to my email?",
    "Quarterly revenue grew by twelve percent, driven by strong demand in Europe.",
    "Rain later.",
    "A replica batches many small requests into one forward pass of the model.",
    "What is the capital of Australia?",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The meeting was moved to Thursday afternoon because the projector was broken "
    "and nobody could find the spare one in the storage room.",
    "Embeddings map text to vectors so that similar meanings lie close together.",
    "Ok.",
    "Ray Serve routes each request to a replica that holds the model in memory.",
    "Tributary serves embeddings, reranking and text generation on two small cores.",
)


class SentenceEmbedder:
    def __init__(
        self, model_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        self.model = SentenceTransformer(str(model_dir), device=device, local_files_only=True)
        self.model.eval()
        if dtype != torch.float32:
            self.model.to(dtype)
        self.device = device
        self.tokenizer = self.model.tokenizer
        self.dimension = int(self.model.get_embedding_dimension() or 0)
        self.vocab_size = len(self.tokenizer)
        max_seq_length = self.model.max_seq_length
        if max_seq_length is None:  # sentence-transformers types it optional
            raise TypeError(f"{self.model} declares no max_seq_length")
        self.window = _window_of(self.tokenizer, int(max_seq_length))
        self._pad_id = int(self.tokenizer.pad_token_id or 0)
        self._needs_token_types = "token_type_ids" in self.tokenizer.model_input_names
        self.input_names = ["input_ids", "attention_mask"]
        if self._needs_token_types:
            self.input_names.append("token_type_ids")
        self.forward: Forward = TorchForward(self.graph(), device, dtype, copy=False)

    def graph(self) -> torch.nn.Module:
        """The model as one module over plain tensors: what the runtimes run and export."""
        return _EmbeddingGraph(self.model, self.input_names)

    def sample(self, size: int) -> Features:
        """A batch of `size` sentences' features, for measuring runtimes."""
        texts = [SAMPLE_TEXTS[i % len(SAMPLE_TEXTS)] for i in range(size)]
        return self.features([self.window.wrap(ids)[0] for ids in self.tokenize(texts)])

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens and without truncation."""
        if not texts:
            return []
        encoded = self.tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)
        return [list(ids) for ids in encoded["input_ids"]]

    def features(self, inputs: list[list[int]]) -> Features:
        """Padded int64 arrays of model inputs (special tokens included)."""
        longest = max(len(ids) for ids in inputs)
        input_ids = np.full((len(inputs), longest), self._pad_id, dtype=np.int64)
        attention = np.zeros((len(inputs), longest), dtype=np.int64)
        for row, ids in enumerate(inputs):
            input_ids[row, : len(ids)] = ids
            attention[row, : len(ids)] = 1
        features = {"input_ids": input_ids, "attention_mask": attention}
        if self._needs_token_types:
            features["token_type_ids"] = np.zeros_like(input_ids)
        return features

    @property
    def pooling(self) -> str:
        """The pooling module's mode ("mean", "cls", ...), as TEI's /info names it."""
        for module in self.model:
            mode = getattr(module, "pooling_mode", None)
            if isinstance(mode, str):
                return mode
        return "unknown"

    @property
    def prompts(self) -> dict[str, str]:
        """The model's named prompts (config_sentence_transformers.json), prepended to a text
        as sentence-transformers' `encode(prompt_name=...)` does."""
        prompts = self.model.prompts or {}
        return {name: text for name, text in prompts.items() if text is not None}

    def embed(self, inputs: list[list[int]], normalize: bool = True) -> np.ndarray:
        """Float32 embeddings of model inputs (special tokens included), unit length unless
        `normalize` is false."""
        vectors = np.asarray(self.forward(self.features(inputs)), dtype=np.float32)
        if not normalize:
            return vectors
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.maximum(norms, 1e-12)


class _EmbeddingGraph(torch.nn.Module):
    def __init__(self, model: SentenceTransformer, input_names: list[str]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *tensors: torch.Tensor, **named: torch.Tensor) -> torch.Tensor:
        features = dict(zip(self.input_names, tensors, strict=False)) | named
        return self.model(features)["sentence_embedding"]


def _window_of(tokenizer: Any, max_tokens: int) -> TokenWindow:
    """Learn which special tokens the tokenizer wraps a text in, by tokenizing one word
    with and without them."""
    probe = "hello"
    plain = list(tokenizer(probe, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(probe, add_special_tokens=True)["input_ids"])
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return TokenWindow(
                prefix=tuple(full[:start]),
                suffix=tuple(full[start + len(plain) :]),
                max_tokens=max_tokens,
            )
    raise ValueError("cannot locate the text inside the tokenizer's special tokens")
