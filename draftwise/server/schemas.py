"""OpenAI request bodies (the fields served, the ones refused) and the error object.

Parameters OpenAI defines but draftwise does not implement are accepted only at their neutral
value (n=1, no echo, zero penalties, ...); anything else is a 400 that names them. `logprobs`
(completions: 0–20 alternatives; chat: `logprobs` + `top_logprobs` 0–20) are the target's raw
log-probabilities of each emitted token.
draftwise's extensions: `top_k`, `speculation` (false: plain decoding for this request),
`num_draft_tokens` (fix D for this request) and `return_token_ids` (token ids in each choice).
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Float = Annotated[float, Field(allow_inf_nan=False)]
MAX_LOGPROBS = 20  # as vLLM's default max_logprobs


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, as OpenAI does

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[Float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[Float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: Float = 0.0
    frequency_penalty: Float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # draftwise extensions
    speculation: bool = True
    num_draft_tokens: Annotated[int, Field(ge=0, le=64)] | None = None
    return_token_ids: bool = False

    def unsupported(self) -> list[str]:
        """Names of OpenAI parameters set to a value draftwise does not implement."""
        bad = [k for k, v in (("n", self.n != 1), ("presence_penalty", self.presence_penalty != 0),
                              ("frequency_penalty", self.frequency_penalty != 0),
                              ("logit_bias", bool(self.logit_bias))) if v]
        return bad + self._unsupported()

    def _unsupported(self) -> list[str]:
        return []

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def draft_tokens(self) -> int | None:
        return 0 if not self.speculation else self.num_draft_tokens

    def logprobs_k(self) -> int | None:
        """None: no logprobs; k: each token's logprob and its top k alternatives."""
        return self.logprobs


class CompletionRequest(_Common):
    prompt: str | list[Annotated[int, Field(ge=0)]] | list[str] | list[list[int]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16  # OpenAI's default for completions
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: int | None = None
    suffix: str | None = None

    def _unsupported(self) -> list[str]:
        batched = isinstance(self.prompt, list) and bool(self.prompt) and not isinstance(self.prompt[0], int)
        return [k for k, v in (("prompt (a list of prompts)", batched), ("echo", self.echo),
                               ("best_of", self.best_of not in (None, 1)),
                               ("suffix", bool(self.suffix))) if v]


class ContentPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Common):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[dict] | None = None
    response_format: dict | None = None
    add_generation_prompt: bool = True  # vLLM's extensions, sent by `draftwise bench --endpoint-api chat`
    continue_final_message: bool = False

    def _unsupported(self) -> list[str]:
        fmt = self.response_format and self.response_format.get("type") not in (None, "text")
        return [k for k, v in (("tools", bool(self.tools)), ("response_format", bool(fmt))) if v]

    def logprobs_k(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat(self) -> tuple[list[dict], str]:
        """(messages for the chat template, text that opens the assistant turn)."""
        msgs = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in self.messages]
        if self.continue_final_message and msgs[-1]["role"] == "assistant":
            return msgs[:-1], msgs[-1]["content"]
        return msgs, ""


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


def error_json(status: int, message: str, param: str | None = None) -> dict:
    kind = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_exceeded",
            503: "service_unavailable"}.get(status, "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": str(status)}}
