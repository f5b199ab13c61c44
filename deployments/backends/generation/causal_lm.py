"""A Hugging Face causal LM loaded from a local directory: tokenise prompts and chats, and
run batched (static) `generate`. No Ray and no HTTP here.

Any checkpoint saved with `save_pretrained` loads through this class; the demo model
(`demo_llm.py`) is built into such a directory first and then goes the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

from deployments.backends.generation.demo_llm import DEMO_PREFIX, demo_model_dir
from deployments.backends.generation.sampling import RowSampler, SamplingParams, sample_rows
from deployments.backends.sources import resolve_model_source
from deployments.core.memory.kv_budget import KvShape

# For a tokenizer without a chat template (a base model): one line per message, then the
# assistant's turn. Documented in docs/api.md.
DEFAULT_ROLE_FORMAT = "{role}: {content}\n"
DEFAULT_GENERATION_PROMPT = "assistant:"

# on_step(tokens): one entry per row of the batch, the token it got at this step, or None
# once it has finished.
StepCallback = Callable[[list[int | None]], None]
# on_error(row, message): that row failed on its own (its sampler raised) and was ended.
RowErrorCallback = Callable[[int, str], None]


def resolve_lm_source(source: str, cache_dir: Path | None = None) -> Path:
    """`demo:<name>` (built on first use), `package:<module>`, or a local directory."""
    if source.startswith(DEMO_PREFIX):
        return demo_model_dir(source.removeprefix(DEMO_PREFIX), cache_dir)
    return resolve_model_source(source)


class CausalLM:
    def __init__(self, path: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        self.path = path
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        self.model = model.to(device).eval()
        self.device = device
        config = self.model.config.get_text_config()
        window = getattr(config, "max_position_embeddings", None) or self.tokenizer.model_max_length
        self.context_window = int(min(window, self.tokenizer.model_max_length))
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids: frozenset[int] = frozenset(
            [] if eos is None else [eos] if isinstance(eos, int) else eos
        )
        pad = self.tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else min(self.eos_ids, default=0)

    def kv_shape(self) -> KvShape:
        """What one token costs in the KV cache: a key and a value per layer and KV head."""
        config = self.model.config.get_text_config()
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return KvShape(
            layers=int(config.num_hidden_layers),
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            dtype_bytes=self.model.dtype.itemsize,
        )

    @property
    def has_chat_template(self) -> bool:
        return bool(self.tokenizer.chat_template)

    def chat_ids(self, messages: Sequence[dict[str, str]]) -> list[int]:
        if self.has_chat_template:
            text = self.tokenizer.apply_chat_template(
                list(messages), add_generation_prompt=True, tokenize=False
            )
            # The template writes the special tokens (BOS) itself.
            return list(self.tokenizer(text, add_special_tokens=False).input_ids)
        text = "".join(DEFAULT_ROLE_FORMAT.format(**m) for m in messages)
        return self.prompt_ids(text + DEFAULT_GENERATION_PROMPT)

    def prompt_ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text).input_ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: Sequence[int],
        sampling: Sequence[SamplingParams],
        on_step: StepCallback | None = None,
        cancelled: Callable[[int], bool] | None = None,
        on_error: RowErrorCallback | None = None,
    ) -> list[list[int]]:
        """Static batching: all prompts in one `generate`, left-padded; each row stops at
        EOS, at its own `max_new_tokens` or once `cancelled(row)`, the batch when every
        row has. Returns the new tokens of each row (EOS excluded). A row whose sampling
        fails ends there and is named to `on_error`; the others go on."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        samplers = [RowSampler.of(s) for s in sampling]
        tap = _StepTap(list(max_new_tokens), samplers, self, on_step, cancelled, on_error)
        self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max(max_new_tokens),
            do_sample=False,  # _StepTap samples the rows that ask for it
            logits_processor=LogitsProcessorList([tap]),
            eos_token_id=sorted(self.eos_ids) or None,
            pad_token_id=self.pad_id,
        )
        return tap.outputs


class _StepTap:
    """The last logits processor of a static batch: samples per row, ends a row at its
    own limit (by forcing EOS, so `generate` treats it as finished), and reports the
    token each row gets, which is the argmax of what it returns."""

    def __init__(
        self,
        limits: list[int],
        samplers: list[RowSampler],
        lm: CausalLM,
        on_step: StepCallback | None,
        cancelled: Callable[[int], bool] | None = None,
        on_error: RowErrorCallback | None = None,
    ) -> None:
        self.limits = limits
        self.on_error = on_error
        self.cancelled = cancelled
        self.samplers: list[RowSampler | None] = list(samplers)
        self.outputs: list[list[int]] = [[] for _ in limits]
        self.done = [False] * len(limits)
        self.eos = min(lm.eos_ids) if lm.eos_ids else None
        self.eos_ids = lm.eos_ids
        self.on_step = on_step

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for i, error in sample_rows(scores, self.samplers).items():
            # Raising here would fail every row of the batch: this row alone ends.
            self.done[i] = True
            self.samplers[i] = None
            if self.on_error is not None:
                self.on_error(i, f"sampling failed: {type(error).__name__}")
        chosen = scores.argmax(dim=-1).tolist()
        step: list[int | None] = []
        for i, token in enumerate(chosen):
            if not self.done[i] and self.cancelled is not None and self.cancelled(i):
                self.done[i] = True
            if self.done[i]:
                step.append(None)
                if self.eos is not None:  # keep a finished row finished
                    scores[i].fill_(float("-inf"))
                    scores[i, self.eos] = 0.0
                continue
            if token in self.eos_ids:
                self.done[i] = True
                step.append(None)
                continue
            self.outputs[i].append(token)
            step.append(token)
            self.done[i] = len(self.outputs[i]) >= self.limits[i]
        if self.on_step is not None:
            self.on_step(step)
        return scores
