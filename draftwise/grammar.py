"""Grammar constraints over llguidance (docs/agents.md, "Structured outputs", says why llguidance).

A `Grammars` compiles for one tokenizer and logits width: `json_schema(schema)`,
`json_object()` (any JSON object), `lark(text)`; each gives a `Grammar`, immutable and shared by
the requests that use it. `Grammar.start()` gives a request its own `Constraint`, the parser state
after the tokens it has consumed:

    allowed()        [V] bool: the tokens the grammar allows next
    walk(draft)      the masks at every drafted position: row i is the mask after the draft's first
                     i tokens (the grammar advanced through them, pending until `settle`)
    settle(n, more)  keep n of the walked draft tokens (the accepted ones), roll the rest back,
                     then consume `more` (the recovered or bonus token)
    rollback(n)      forget the last n consumed tokens
    advance(tokens)  consume tokens (the prefill's first token)
    forced(limit)    the run of tokens the grammar fixes from here (e.g. `", "age": ` between two
                     values): a draft that costs no drafting
    finished         the grammar is complete and allows nothing but EOS

JSON is written on one line with `, ` and `: ` between items (json.dumps's layout), so the
separators are forced tokens and no answer can loop on whitespace.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass

import numpy as np
import torch

from draftwise.tokenizer import Tokenizer

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _llguidance():
    from draftwise.extras import require
    require("structured outputs", "grammar")  # one line naming the extra when llguidance is missing
    import llguidance
    return llguidance


class Grammars:
    """The grammar compiler for one tokenizer (draftwise.tokenizer.Tokenizer, or a test tokenizer
    with `tokens` [V] bytes, `eos_token_ids` and `encode_bytes`) and the target's logits width."""

    def __init__(self, tokenizer, vocab_size: int):
        llg = _llguidance()
        self.vocab_size = vocab_size
        eos = sorted(tokenizer.eos_token_ids)
        if isinstance(tokenizer, Tokenizer):  # a Hugging Face tokenizer: llguidance reads it whole
            import llguidance.hf
            self.tok = llguidance.hf.from_tokenizer(tokenizer.hf, n_vocab=vocab_size, eos_token=eos)
        else:
            self.tok = llg.LLTokenizer(llg.TokenizerWrapper(_Wrapped(tokenizer)), n_vocab=vocab_size, eos_token=eos)
        self.eos = eos

    def json_schema(self, schema: dict | str, free_layout: bool = False) -> Grammar:
        """ValueError naming the problem for a schema that is not JSON, not an object, or uses a
        feature the engine does not enforce. `free_layout`: any whitespace between items, not
        JSON_LAYOUT's (to check answers other servers laid out)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ValueError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise ValueError(f"a JSON schema is an object, got {type(schema).__name__}")
        llg = _llguidance()
        layout = None if free_layout else dict(JSON_LAYOUT)
        return self._grammar(llg.LLMatcher.grammar_from_json_schema(schema, defaults=layout), "json_schema")

    def json_object(self) -> Grammar:
        """Any JSON object (OpenAI's response_format json_object)."""
        return self.json_schema({"type": "object"})

    def lark(self, text: str) -> Grammar:
        return self._grammar(_llguidance().LLMatcher.grammar_from_lark(text), "lark")

    def _grammar(self, compiled: str, kind: str) -> Grammar:
        llg = _llguidance()
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(compiled, self.tok)
        if is_error:
            raise ValueError(f"the {kind} is invalid or uses a feature llguidance does not enforce: "
                             f"{_first_line(messages[0])}")
        unsupported = [m for m in messages if "unsupported" in m.lower() or "ignored" in m.lower()]
        if unsupported:  # llguidance would generate without enforcing these: refuse instead
            raise ValueError(f"unsupported {kind} feature: {unsupported[0]} (remove it from the schema)")
        return Grammar(self, compiled, kind)


class _Wrapped:
    """A test tokenizer as llguidance's TokenizerWrapper reads one."""

    def __init__(self, tok):
        self.tokens, self.eos_token_id, self.bos_token_id = list(tok.tokens), min(tok.eos_token_ids), None
        self.special_token_ids = sorted(tok.eos_token_ids)
        self._encode = tok.encode_bytes

    def __call__(self, data: bytes | str) -> list[int]:
        return self._encode(data.encode() if isinstance(data, str) else data)


@dataclass(frozen=True, slots=True)
class Grammar:
    """A compiled grammar; `start()` a request's own state over it."""
    grammars: Grammars
    compiled: str
    kind: str  # json_schema | lark

    @property
    def vocab_size(self) -> int:
        return self.grammars.vocab_size

    def start(self) -> Constraint:
        m = _llguidance().LLMatcher(self.grammars.tok, self.compiled, log_level=0)
        if m.is_error():
            raise ValueError(f"the grammar failed to start: {_first_line(m.get_error())}")
        return Constraint(m, self.grammars.vocab_size, self.grammars.eos)


class Constraint:
    """One request's parser state (see the module docstring). Tokens walked through a draft stay
    consumed until `settle` keeps the accepted ones and rolls the rest back."""

    def __init__(self, matcher, vocab_size: int, eos: list[int]):
        self.m, self.vocab_size, self.eos = matcher, vocab_size, eos
        # per draft token walked and not yet settled: whether the matcher recorded it (an EOS
        # consumed once the grammar has stopped is not, and a rollback must not count it)
        self._walked: list[bool] = []
        self.seconds = 0.0  # spent in the grammar: masks, walks, rollbacks (SpecStats.grammar_s)

    def allowed(self) -> torch.Tensor:  # [V] bool
        t = time.perf_counter()
        if self.m.is_stopped():  # complete (or an EOS consumed): only EOS may follow
            row = torch.zeros(self.vocab_size, dtype=torch.bool)
            row[self.eos] = True
        else:
            bits = np.frombuffer(self.m.compute_bitmask(), np.uint8)
            row = torch.from_numpy(np.unpackbits(bits, bitorder="little")[: self.vocab_size].astype(bool))
            self._check()
        self.seconds += time.perf_counter() - t
        return row

    def walk(self, draft: list[int]) -> torch.Tensor:
        """[n+1, V] bool masks, n = the draft's longest prefix the grammar allows: row i is the
        mask after the first i tokens, which stay consumed (pending) until `settle`."""
        if self._walked:
            raise RuntimeError("settle the last walked draft before walking another")
        t = time.perf_counter()
        n = self.m.validate_tokens(draft) if draft else 0
        self.seconds += time.perf_counter() - t
        rows = [self.allowed()]
        for tok in draft[:n]:
            self._walked.append(self._consume(tok))
            rows.append(self.allowed())
        return torch.stack(rows)

    def extend(self, tokens: list[int]) -> torch.Tensor:  # [V] bool
        """The mask after `tokens` too, consumed on top of those walked (a drafter with a model walks
        its draft as it draws it, drafters.base.Masker; `settle(0, [])` rolls them all back)."""
        for tok in tokens:
            self._walked.append(self._consume(tok))
        return self.allowed()

    def settle(self, accepted: int, more: list[int]) -> None:
        """Keep `accepted` walked draft tokens, roll back the rest, then consume `more`."""
        if not 0 <= accepted <= len(self._walked):
            raise ValueError(f"{accepted} accepted of {len(self._walked)} walked draft tokens")
        rejected, self._walked = sum(self._walked[accepted:]), []
        self.rollback(rejected)
        self.advance(more)

    def rollback(self, n: int) -> None:
        """Forget the last n consumed tokens."""
        t = time.perf_counter()
        ok = not n or self.m.rollback(n)
        self.seconds += time.perf_counter() - t
        if not ok:
            raise RuntimeError(f"the grammar could not roll back {n} tokens: {_first_line(self.m.get_error())}")

    def advance(self, tokens: list[int]) -> None:
        for t in tokens:
            if self.m.is_stopped():  # past an EOS: the request ends there, the rest is discarded
                return
            self._consume(t)

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar fixes from here (each allowed in turn)."""
        if limit < 1 or self.m.is_stopped():
            return []
        t = time.perf_counter()
        run = self.m.compute_ff_tokens()[:limit]
        run = run[: self.m.validate_tokens(run)] if run else []
        self.seconds += time.perf_counter() - t
        return run

    @property
    def finished(self) -> bool:
        return self.m.is_stopped() or (self.m.is_accepting() and self._only_eos())

    def _only_eos(self) -> bool:
        row = self.allowed()
        return bool(row.any()) and bool(row[self.eos].sum() == row.sum())

    def _consume(self, t: int) -> bool:
        """Consume t; whether the matcher recorded it (an EOS once stopped, or refused where the
        grammar is complete, ends the answer without a step to roll back)."""
        t0 = time.perf_counter()
        stopped = self.m.is_stopped()
        recorded = not stopped and self.m.consume_token(t)
        self.seconds += time.perf_counter() - t0
        if not recorded and not (t in self.eos and (stopped or self.m.is_accepting())):
            raise RuntimeError(f"token {t} is not allowed by the grammar here: {_first_line(self.m.get_error())}")
        return recorded

    def _check(self) -> None:
        if self.m.is_error():
            raise RuntimeError(f"the grammar's parser failed: {_first_line(self.m.get_error())}")


def format_schema(response_format: dict | None) -> dict | None:
    """The JSON schema an OpenAI `response_format` asks for ({"type": "object"} for json_object),
    None for text; ValueError naming the problem for any other shape."""
    if response_format is not None and not isinstance(response_format, dict):
        raise ValueError(f"response_format must be an object, got {type(response_format).__name__}")
    kind = (response_format or {}).get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise ValueError(f"response_format.type must be text, json_object or json_schema, got {kind!r}")
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise ValueError("response_format json_schema needs json_schema.schema, a JSON schema object")
    return schema


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0][:300] if message.strip() else "(no message)"
