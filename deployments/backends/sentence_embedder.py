"""A sentence-transformers embedding model behind three calls: tokenize, fit, embed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

from deployments.core.token_window import TokenWindow


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

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens and without truncation."""
        if not texts:
            return []
        encoded = self.tokenizer(texts, add_special_tokens=False, truncation=False, verbose=False)
        return [list(ids) for ids in encoded["input_ids"]]

    def embed(self, inputs: list[list[int]]) -> np.ndarray:
        """Unit-length float32 embeddings of model inputs (special tokens included)."""
        longest = max(len(ids) for ids in inputs)
        input_ids = torch.full((len(inputs), longest), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(inputs), longest), dtype=torch.long)
        for row, ids in enumerate(inputs):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention[row, : len(ids)] = 1
        features = {"input_ids": input_ids, "attention_mask": attention}
        if self._needs_token_types:
            features["token_type_ids"] = torch.zeros_like(input_ids)
        features = {k: v.to(self.device) for k, v in features.items()}
        with torch.inference_mode():
            vectors = self.model(features)["sentence_embedding"]
        vectors = torch.nn.functional.normalize(vectors.float(), dim=1)
        return vectors.cpu().numpy()


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
