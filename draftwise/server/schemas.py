"""OpenAI request bodies (the fields served, the ones refused) and the error object.

Parameters OpenAI defines but draftwise does not implement are accepted only at their neutral
value (n=1, no echo, zero penalties, ...); anything else is a 400 that names them. `logprobs`
(completions: 0–20 alternatives; chat: `logprobs` + `top_logprobs` 0–20) are the target's raw
log-probabilities of each emitted token. `prediction` (Predicted Outputs) is a draft source
(draftwise.drafters.prediction); usage then reports its accepted and rejected tokens. Chat's
`response_format` (json_object, json_schema) and `tools` (`tool_choice`, `parallel_tool_calls`)
are grammars the answer follows, its tool calls read back into `tool_calls` (draftwise.server.tools).
draftwise's extensions: `top_k`, `speculation` (false: plain decoding for this request),
`num_draft_tokens` (fix D for this request) and `return_token_ids` (token ids in each choice).

Every number is checked here against what the engine can take (a seed within a signed 64-bit
integer, as vLLM's; token ids within int32, the vocabulary later), and every text field must be
encodable (a lone surrogate such as "\\ud800" is a 400, not a tokenizer crash).
"""
from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

MAX_LOGPROBS = 20  # as vLLM's default max_logprobs
SEED_MIN, SEED_MAX = -(2 ** 63), 2 ** 63 - 1  # vLLM's range (torch.long): torch's generator takes it
TOKEN_MAX = 2 ** 31 - 1  # llama.cpp's token type is int32; the vocabulary bound is checked later


def _encodable(s: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"text that cannot be encoded as UTF-8 at character {e.start} "
                         "(a lone surrogate escape such as \\ud800?)") from None
    return s


Float = Annotated[float, Field(allow_inf_nan=False)]
Text = Annotated[str, AfterValidator(_encodable)]
TokenId = Annotated[int, Field(ge=0, le=TOKEN_MAX)]


class StreamOptions(BaseModel):
    include_usage: bool = False


class ContentPart(BaseModel):
    type: Literal["text"]
    text: Text


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs: the expected output (text, or text parts on chat), a draft source."""
    type: Literal["content"]
    content: Text | list[ContentPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class CompletionPrediction(Prediction):
    content: Text  # completions take a string


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored, as OpenAI does

    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[Float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[Float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    seed: Annotated[int, Field(ge=SEED_MIN, le=SEED_MAX)] | None = None
    stop: Text | list[Text] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: Float = 0.0
    frequency_penalty: Float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    prediction: Prediction | None = None
    # draftwise extensions
    speculation: bool = True
    num_draft_tokens: Annotated[int, Field(ge=0, le=64)] | None = None
    return_token_ids: bool = False
    private: bool = False  # suffix drafter: neither read from nor add to the trie shared across requests

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
    prompt: Text | list[TokenId] | list[Text] | list[list[TokenId]]
    max_tokens: Annotated[int, Field(ge=1)] | None = 16  # OpenAI's default for completions
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: int | None = None
    suffix: Text | None = None
    prediction: CompletionPrediction | None = None

    def _unsupported(self) -> list[str]:
        batched = isinstance(self.prompt, list) and bool(self.prompt) and not isinstance(self.prompt[0], int)
        return [k for k, v in (("prompt", batched), ("echo", self.echo),
                               ("best_of", self.best_of not in (None, 1)),
                               ("suffix", bool(self.suffix))) if v]


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[ContentPart] | None = None  # None: an assistant turn of tool calls alone
    tool_calls: list[dict] | None = None  # an assistant turn's calls, as the server answered them
    tool_call_id: str | None = None  # a tool turn: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def for_template(self) -> dict:
        """The message as chat templates read it: a call's arguments as an object, not a string."""
        out = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [{"type": "function", "id": c.get("id"),
                                  "function": {"name": c.get("function", {}).get("name"),
                                               "arguments": _arguments(c.get("function", {}).get("arguments"))}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def _arguments(a):
    """A call's arguments (OpenAI sends a JSON string) as an object where they parse."""
    if isinstance(a, str):
        try:
            return json.loads(a)
        except json.JSONDecodeError:
            return a
    return a if a is not None else {}


class ChatCompletionRequest(_Common):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    tools: list[dict] | None = None  # checked by draftwise.server.tools
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool = True
    response_format: dict | None = None
    add_generation_prompt: bool = True  # vLLM's extensions, sent by `draftwise bench --endpoint-api chat`
    continue_final_message: bool = False

    def logprobs_k(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat(self) -> tuple[list[dict], str, bool]:
        """(messages for the chat template, text that opens the assistant turn, whether the
        template adds its generation prompt: a continued final message needs it)."""
        msgs = [m.for_template() for m in self.messages]
        if self.continue_final_message and msgs[-1]["role"] == "assistant":
            return msgs[:-1], msgs[-1]["content"], True
        return msgs, "", self.add_generation_prompt


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody

