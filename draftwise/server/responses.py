"""OpenAI response objects for completions and chat completions, whole and as SSE chunks."""
from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from draftwise.drafters.prediction import prediction_counts
from draftwise.request import Chunk, GenerationResult, TokenLogprobs
from draftwise.server.tools import CallStream, read_calls


def sse(obj) -> str:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"


@dataclass(slots=True)
class Formatter:
    """One request's response shape: `chat` picks chat.completion(.chunk), else text_completion."""
    model: str
    chat: bool
    return_token_ids: bool = False
    piece: Callable[[int], str] | None = None  # token id -> its text; set when logprobs were asked for
    prediction: list[int] | None = None  # the request's predicted output, tokenised: usage counts it
    tool_calls: bool = False  # the answer is read for tool calls (draftwise.server.tools)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    _offset: int = 0  # completions' text_offset, running over a stream
    _calls: CallStream = field(default_factory=CallStream)  # a stream's text split into content and calls

    def _logprobs(self, lps: list[TokenLogprobs] | None, token_ids: list[int] | None) -> dict | None:
        """OpenAI's logprobs object: chat's `content` list, or completions' parallel lists."""
        if self.piece is None or lps is None or token_ids is None:
            return None
        toks = [self.piece(t) for t in token_ids]
        if self.chat:
            def entry(tok: str, lp: float) -> dict:
                return {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))}
            return {"content": [entry(t, x.logprob) | {"top_logprobs": [entry(self.piece(i), v) for i, v in x.top]}
                                for t, x in zip(toks, lps)], "refusal": None}
        offsets = []
        for t in toks:
            offsets.append(self._offset)
            self._offset += len(t)
        return {"tokens": toks, "token_logprobs": [x.logprob for x in lps],
                # OpenAI's completions: the sampled token is always among its top_logprobs (up to k + 1)
                "top_logprobs": [{self.piece(i): v for i, v in x.top} | {t: x.logprob} for t, x in zip(toks, lps)],
                "text_offset": offsets}

    def _envelope(self, choices: list[dict], stream: bool) -> dict:
        obj = "chat.completion" + (".chunk" if stream else "") if self.chat else "text_completion"
        return {"id": ("chatcmpl-" if self.chat else "cmpl-") + self.id, "object": obj,
                "created": self.created, "model": self.model, "choices": choices}

    def _choice(self, text: str | None, finish: str | None, token_ids: list[int] | None, stream: bool,
                first: bool = False, lps: list[TokenLogprobs] | None = None, calls: list[dict] | None = None) -> dict:
        c: dict = {"index": 0}
        logprobs = self._logprobs(lps, token_ids)
        if not self.chat:
            c.update(text=text, logprobs=logprobs)
        elif stream:
            c["delta"] = ({"role": "assistant"} if first else {}) | ({"content": text} if text or first else {}) \
                | ({"tool_calls": calls} if calls else {})
            c["logprobs"] = logprobs
        else:
            c.update(message={"role": "assistant", "content": text} | ({"tool_calls": calls} if calls else {}),
                     logprobs=logprobs)
        c["finish_reason"] = finish
        if self.return_token_ids and token_ids is not None:
            c["token_ids"] = token_ids
        return c

    def usage(self, result: GenerationResult) -> dict:
        n = len(result.token_ids)
        out = {"prompt_tokens": result.prompt_tokens, "completion_tokens": n,
               "total_tokens": result.prompt_tokens + n,
               "prompt_tokens_details": {"cached_tokens": result.stats.cached_tokens}}
        if self.prediction is not None:  # OpenAI's meanings: draftwise.drafters.prediction.PredictionCounts
            counts = prediction_counts(self.prediction, result.token_ids)
            out["completion_tokens_details"] = {"accepted_prediction_tokens": counts.accepted,
                                                "rejected_prediction_tokens": counts.rejected}
        return out

    def whole(self, result: GenerationResult) -> dict:
        text, calls, finish = result.text, None, result.finish_reason
        if self.tool_calls:
            text, calls = read_calls(text)
            finish = "tool_calls" if calls and finish == "stop" else finish
        body = self._envelope([self._choice(text, finish, result.token_ids, False, lps=result.logprobs,
                                            calls=calls)], False)
        body["usage"] = self.usage(result)
        body["draftwise"] = {"stats": result.stats.to_dict(), "ttft_s": result.ttft_s}
        return body

    def first_chunk(self) -> str | None:
        """Chat streams open with the assistant role, as OpenAI's do."""
        return sse(self._envelope([self._choice("", None, None, True, first=True)], True)) if self.chat else None

    def chunk(self, ch: Chunk) -> str | None:
        text, calls, finish = ch.text, None, ch.finish_reason
        if self.tool_calls:  # content until a call opens; each call whole once it closes
            text, calls = self._calls.feed(ch.text)
            if finish:
                rest, last = self._calls.flush()
                text, calls = text + rest, (calls or []) + last
                finish = "tool_calls" if self._calls.calls and finish == "stop" else finish
        if not text and not calls and not finish and not ((self.return_token_ids or self.piece) and ch.token_ids):
            return None  # nothing to say yet (a split character held back)
        return sse(self._envelope([self._choice(text, finish, ch.token_ids, True, lps=ch.logprobs, calls=calls)],
                                  True))

    def usage_chunk(self, result: GenerationResult) -> str:
        body = self._envelope([], True)
        body["usage"] = self.usage(result)
        return sse(body)
