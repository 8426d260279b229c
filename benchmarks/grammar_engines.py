"""Grammar engines side by side: llguidance and xgrammar on the packaged Qwen2.5-Coder tokenizer.

Per schema: compile time, then the mask's time per token along a valid answer (mask computed at
every state the answer passes through, unpacked to a [V] bool tensor as draftwise uses it), and
a draft's walk: consume 8 tokens, roll 8 back. Then coverage: which schema features compile and
are enforced (a valid instance passes, an invalid one is refused).

    .venv/bin/python benchmarks/grammar_engines.py [--repeats 3] > docs/data/agents_json/grammar_engines.txt
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "email": {"type": "string"}, "skills": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "age", "email", "skills"], "additionalProperties": False}
PERSON_OK = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "skills": ["maths", "poetry", "engines"]}
TOOL = {"type": "object", "properties": {
    "location": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer"}}, "required": ["location", "unit", "days"], "additionalProperties": False}
TOOL_OK = {"location": "Paris, France", "unit": "celsius", "days": 3}
ORDERS = {"type": "object", "properties": {"orders": {"type": "array", "items": {
    "type": "object", "properties": {"id": {"type": "string"}, "qty": {"type": "integer"},
                                     "price": {"type": "number"}, "shipped": {"type": "boolean"}},
    "required": ["id", "qty", "price", "shipped"], "additionalProperties": False}}},
    "required": ["orders"], "additionalProperties": False}
ORDERS_OK = {"orders": [{"id": f"A-{i}", "qty": i, "price": 9.5 * i, "shipped": i % 2 == 0} for i in range(1, 6)]}
ANY = {"type": "object"}  # json_object
ANY_OK = {"summary": "a function that adds two numbers", "lines": [1, 2, 3], "ok": True, "extra": None}
TIMED = [("person", PERSON, PERSON_OK), ("tool-args", TOOL, TOOL_OK), ("orders", ORDERS, ORDERS_OK),
         ("json_object", ANY, ANY_OK)]

S = {"type": "string"}
FEATURES = [  # name, schema, a valid instance, an invalid one
    ("enum", {"enum": ["a", "b"]}, "a", "c"),
    ("const", {"const": 3}, 3, 4),
    ("pattern", {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}, "AB-123", "ab-123"),
    ("format date-time", {"type": "string", "format": "date-time"}, "2026-12-07T10:00:00Z", "yesterday"),
    ("format email", {"type": "string", "format": "email"}, "a@b.org", "not an email"),
    ("format uuid", {"type": "string", "format": "uuid"}, "123e4567-e89b-12d3-a456-426614174000", "x-y"),
    ("minLength/maxLength", {"type": "string", "minLength": 2, "maxLength": 3}, "abc", "abcd"),
    ("minimum/maximum", {"type": "integer", "minimum": 1, "maximum": 9}, 5, 12),
    ("exclusiveMinimum (number)", {"type": "number", "exclusiveMinimum": 0}, 0.5, -1),
    ("multipleOf", {"type": "integer", "multipleOf": 5}, 15, 7),
    ("minItems/maxItems", {"type": "array", "items": S, "minItems": 1, "maxItems": 2}, ["a"], []),
    ("uniqueItems", {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, [1, 2], [1, 1]),
    ("prefixItems", {"type": "array", "prefixItems": [S, {"type": "integer"}], "items": False}, ["a", 1], [1, "a"]),
    ("anyOf", {"anyOf": [S, {"type": "integer"}]}, 3, True),
    ("oneOf", {"oneOf": [S, {"type": "integer"}]}, "x", None),
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": S}, "required": ["a"]},
                         {"type": "object", "properties": {"b": S}, "required": ["b"]}]},
     {"a": "x", "b": "y"}, {"a": "x"}),
    ("$ref/$defs", {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
                    "$ref": "#/$defs/p"}, {"x": 1}, {"x": "1"}),
    ("recursive $ref", {"$defs": {"n": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v", "kids"]}},
        "$ref": "#/$defs/n"}, {"v": 1, "kids": [{"v": 2, "kids": []}]}, {"v": 1, "kids": [{"v": "2"}]}),
    ("additionalProperties schema", {"type": "object", "additionalProperties": {"type": "integer"}},
     {"a": 1}, {"a": "x"}),
    ("patternProperties", {"type": "object", "patternProperties": {"^x_": {"type": "integer"}},
                           "additionalProperties": False}, {"x_a": 1}, {"y": 1}),
    ("optional properties", {"type": "object", "properties": {"a": S, "b": S}, "required": ["a"],
                             "additionalProperties": False}, {"a": "x"}, {"b": "x"}),
    ("type list (nullable)", {"type": ["string", "null"]}, None, 1),
    ("if/then/else", {"if": {"type": "integer"}, "then": {"minimum": 0}, "else": S}, 1, -1),
    ("not", {"not": {"type": "string"}}, 1, "x"),
    ("dependentRequired", {"type": "object", "properties": {"a": S, "b": S}, "dependentRequired": {"a": ["b"]}},
     {"a": "x", "b": "y"}, {"a": "x"}),
]


def load_tokenizer():
    from draftwise.models.load import load_tokenizer as lt
    from draftwise.models.registry import resolve
    return lt(resolve("qwen2.5-coder-1.5b")).hf


class LLG:
    name = "llguidance"

    def __init__(self, hf, vocab):
        import llguidance
        import llguidance.hf
        self.llg, self.vocab = llguidance, vocab
        self.tok = llguidance.hf.from_tokenizer(hf, n_vocab=vocab)

    def matcher(self, schema):
        g = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
        m = self.llg.LLMatcher(self.tok, g, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def mask(self, m):
        return np.unpackbits(np.frombuffer(m.compute_bitmask(), np.uint8), bitorder="little")[: self.vocab]

    def consume(self, m, toks) -> bool:
        return m.consume_tokens(toks) if toks else True

    def rollback(self, m, n):
        m.rollback(n)


class XGR:
    name = "xgrammar"

    def __init__(self, hf, vocab):
        import torch
        import xgrammar as xgr
        self.xgr, self.vocab, self.torch = xgr, vocab, torch
        self.compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab))
        self.bits = xgr.allocate_token_bitmask(1, vocab)

    def matcher(self, schema):
        cg = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
        return self.xgr.GrammarMatcher(cg, max_rollback_tokens=64)

    def mask(self, m):
        m.fill_next_token_bitmask(self.bits)
        return np.unpackbits(self.bits.numpy().view(np.uint8), bitorder="little")[: self.vocab]

    def consume(self, m, toks) -> bool:
        for i, t in enumerate(toks):
            if not m.accept_token(t):
                return False
        return True

    def rollback(self, m, n):
        m.rollback(n)


def timed(engine, hf, schema, instance, repeats):
    t = time.perf_counter()
    engine.matcher(schema)
    compile_ms = (time.perf_counter() - t) * 1e3
    toks = hf.encode(json.dumps(instance), add_special_tokens=False)
    masks, walks = [], []
    for _ in range(repeats):
        m = engine.matcher(schema)
        for i, tok in enumerate(toks):
            t = time.perf_counter()
            allowed = engine.mask(m)
            masks.append(time.perf_counter() - t)
            assert allowed[tok], f"{engine.name}: token {i} ({hf.decode([tok])!r}) refused"
            engine.consume(m, [tok])
        m = engine.matcher(schema)
        for i in range(0, len(toks) - 8, 8):
            t = time.perf_counter()
            engine.consume(m, toks[i:i + 8])
            engine.rollback(m, 8)
            walks.append(time.perf_counter() - t)
            engine.consume(m, toks[i:i + 8])
    return compile_ms, len(toks), statistics.median(masks) * 1e3, max(masks) * 1e3, statistics.median(walks) * 1e3


def enforced(engine, hf, schema, good, bad) -> str:
    try:
        m = engine.matcher(schema)
    except Exception as e:  # noqa: BLE001
        return f"refused ({str(e).splitlines()[0][:60]})"
    ok = engine.consume(m, hf.encode(json.dumps(good), add_special_tokens=False))
    m = engine.matcher(schema)
    wrong = engine.consume(m, hf.encode(json.dumps(bad), add_special_tokens=False))
    if wrong:  # the whole invalid text was taken: may the grammar end there?
        allowed = engine.mask(m)
        wrong = bool(allowed[hf.eos_token_id]) if hf.eos_token_id is not None else True
    return "enforced" if ok and not wrong else ("valid refused" if not ok else "ignored")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    hf = load_tokenizer()
    vocab = 151936  # the model's logits width (the tokenizer holds 151,665)
    engines = []
    for cls in (LLG, XGR):
        t = time.perf_counter()
        engines.append(cls(hf, vocab))
        print(f"{cls.name}: tokenizer set-up {time.perf_counter() - t:.2f} s")
    print("\n| engine | schema | compile ms | answer tokens | mask ms/token (median) | max | consume 8 + rollback 8 ms |")
    print("|---|---|---|---|---|---|---|")
    for e in engines:
        for name, schema, inst in TIMED:
            c, n, med, mx, walk = timed(e, hf, schema, inst, a.repeats)
            print(f"| {e.name} | {name} | {c:.1f} | {n} | {med:.3f} | {mx:.2f} | {walk:.3f} |")
    print("\n| feature | " + " | ".join(e.name for e in engines) + " |")
    print("|---|" + "---|" * len(engines))
    for name, schema, good, bad in FEATURES:
        print(f"| {name} | " + " | ".join(enforced(e, hf, schema, good, bad) for e in engines) + " |")


if __name__ == "__main__":
    main()
