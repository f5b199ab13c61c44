"""Request and response shapes of /v1/chat/completions and /v1/completions (OpenAI's)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from deployments.ingress.api.schemas import (
    INT64_MAX,
    INT64_MIN,
    ApiModel,
    Count,
    NonEmptyStr,
    Number,
)


class TextPart(ApiModel):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(ApiModel):
    role: Literal["system", "user", "assistant", "developer"]
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class StreamOptions(ApiModel):
    include_usage: StrictBool = False


class SamplingFields(ApiModel):
    """What both routes share. Fields OpenAI has and Tributary does not implement are
    accepted only at their neutral value, so a client never gets silent misbehaviour."""

    model: StrictStr = Field(..., description="A generation model from GET /v1/models.")
    max_tokens: Count | None = Field(
        None,
        description="Most tokens to generate; default and limit per model (over the "
        "limit: 400 `max_tokens_exceeded` naming it).",
    )
    temperature: Number = Field(1.0, ge=0, le=2, description="0 = greedy decoding.")
    top_p: Number = Field(1.0, gt=0, le=1, description="Nucleus sampling mass, in (0, 1].")
    seed: StrictInt | None = Field(
        None,
        ge=INT64_MIN,
        le=INT64_MAX,
        description="A signed 64-bit integer. Makes sampling repeatable: same seed, prompt "
        "and parameters, same text (on the same engine).",
    )
    stop: StrictStr | list[StrictStr] | None = Field(
        None, description="Up to 4 strings; generation ends before the first one."
    )
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(1, ge=1, le=128, description="Only 1 is supported.")
    user: StrictStr | None = Field(
        None, description="End-user id; keeps that user on one model version (sticky)."
    )
    priority: Literal["realtime", "normal", "batch"] | None = Field(
        None, description="Priority class (as the X-Priority header), capped by the key's tier."
    )
    presence_penalty: Number = Field(0.0, ge=-2, le=2, description="Only 0 is supported.")
    frequency_penalty: Number = Field(0.0, ge=-2, le=2, description="Only 0 is supported.")
    # Chat's is a boolean, text completion's an integer (how many alternatives per token).
    logprobs: StrictBool | StrictInt | None = Field(
        None, description="Not supported: null or false only."
    )

    @model_validator(mode="after")
    def _supported(self) -> SamplingFields:
        if self.n != 1:
            raise Unsupported("n", "Only n=1 is supported; send n requests instead.")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                raise Unsupported(name, f"'{name}' is not supported; leave it at 0.")
        # `is`, not `in`: 0 == False in Python, and logprobs=0 still asks for logprobs.
        if self.logprobs is not None and self.logprobs is not False:
            raise Unsupported("logprobs", "'logprobs' is not supported.")
        if self.stream_options is not None and not self.stream:
            raise Unsupported("stream_options", "'stream_options' needs 'stream': true.")
        return self

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: Count | None = Field(
        None, description="Same as max_tokens, and wins over it."
    )


class CompletionRequest(SamplingFields):
    prompt: NonEmptyStr | list[NonEmptyStr] = Field(
        ...,
        description="One prompt, not empty (whitespace is a valid prompt): a string or a "
        "one-element array.",
    )
    echo: StrictBool = Field(False, description="Only false is supported.")
    best_of: StrictInt = Field(1, ge=1, le=20, description="Only 1 is supported.")

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionRequest:
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise Unsupported("prompt", "Send one prompt per request (a string).")
        if self.echo:
            raise Unsupported("echo", "'echo' is not supported.")
        if self.best_of != 1:
            raise Unsupported("best_of", "Only best_of=1 is supported.")
        return self

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class Unsupported(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
        self.message = message
