"""Structured outputs (docs/agents.md), three subcommands.

`json`: constrained plain vs constrained speculative decoding on the JSON-extraction workload, side
by side in one run on one loaded target (greedy): time per token end to end and after the first
token, the grammar's time (masks, walks, rollbacks), acceptance, schema validity and identity with
constrained plain decoding. Rows go to OUT/rows.jsonl, the table to stdout (`--table ROWS` remakes it).

    flock /work/runs/cpu.lock .venv/bin/python benchmarks/agents.py json \
        --out docs/data/agents_json --drafters ngram suffix --max-tokens 160

`engines`: llguidance and xgrammar on the packaged Qwen2.5-Coder tokenizer. Per schema: compile
time, the mask's time per token along a valid answer (computed at every state the answer passes
through, unpacked to a [V] bool tensor as draftwise uses it), a draft's walk (consume 8 tokens,
roll 8 back). Then coverage: which schema features compile and are enforced (a valid instance
passes, an invalid one is refused). An engine not installed is skipped with a line saying so.

    .venv/bin/python benchmarks/agents.py engines [--repeats 3] > docs/data/agents_json/grammar_engines.txt

`forced ROWS`: what joining a grammar's forced runs with the drafter's tokens in one round could
gain, replayed offline on a `json` run's plain answers with n-gram drafts sized by an oracle (the
tokens the answer took, so each way is at its best and only its rounds differ), priced on a cost
curve (ms per forward of k tokens): `separate` (a forced run is a round of its own, as draftwise
drafts today), `then-draft` (the forced run, then the n-gram's continuation), `interleaved`
(forced run, n-gram tokens, the forced run after them, ... up to --max-draft).

    .venv/bin/python benchmarks/agents.py forced docs/data/agents_json/rows.jsonl [--curve 1:27,2:48,...]

`peers RUN`: a `benchmarks/server_bench.py --api chat` run over the JSON and tool-call rows
(docs/data/agents_peers/command.sh): per server, the answers valid against their schemas, tool calls
read back, and seconds per answer (servers lay JSON out differently, so tokens are not comparable).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from draftwise.drafters.base import common_prefix

WORKLOAD = Path(__file__).parent / "workloads" / "json_extraction_2026_12_07.jsonl"


def run(engine, ids: list[int], grammar, max_tokens: int) -> dict:
    r = engine.generate(ids, max_tokens=max_tokens, constraint=grammar)
    s, n = r.stats, len(r.token_ids)
    return {"tokens": n, "wall_s": s.wall_s, "ttft_s": r.ttft_s, "grammar_s": s.grammar_s,
            "after_first_ms": 1e3 * (s.wall_s - r.ttft_s) / max(n - 1, 1), "proposed": s.proposed_tokens,
            "accepted": s.accepted_draft_tokens, "finish": r.finish_reason, "text": r.text, "token_ids": r.token_ids}


def valid(grammar, token_ids: list[int], text: str) -> bool:
    """The whole answer parses and a fresh parser of the schema takes it to its end."""
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    c = grammar.start()
    c.advance(token_ids)
    return c.finished


def measure(engines: dict, tok, grammars, rows: list[dict], max_tokens: int, out: Path) -> Path:
    """Each workload row on each engine (the first is plain); rows to out/rows.jsonl, progress to stderr."""
    from draftwise.compare import first_divergence
    out.mkdir(parents=True, exist_ok=True)
    warm = grammars.json_object()  # one untimed request per engine: kernels, cost curves, the grammar's caches
    for eng in engines.values():
        eng.generate(tok.apply_chat([{"role": "user", "content": "Say hi as JSON."}]), max_tokens=16, constraint=warm)
    with open(out / "rows.jsonl", "w") as f:
        for row in rows:
            g = grammars.json_schema(row["response_format"]["json_schema"]["schema"])
            ids = tok.apply_chat(row["messages"])
            plain = {}  # per backend (a config's "@BACKEND"): its constrained plain answer, the reference
            for name, eng in engines.items():
                r = run(eng, ids, g, max_tokens)
                r.update(id=row["id"], config=name, prompt_tokens=len(ids), valid=valid(g, r["token_ids"], r["text"]))
                ref = plain.setdefault(name.partition("@")[2], r)
                r["divergence"] = first_divergence(ref["token_ids"], r["token_ids"])
                f.write(json.dumps({k: v for k, v in r.items() if k != "token_ids"}) + "\n")
                print(f"{row['id']:10s} {name:7s} {r['tokens']:4d} tok  {r['after_first_ms']:6.1f} ms/tok after "
                      f"the first  grammar {1e3 * r['grammar_s'] / max(r['tokens'], 1):.2f} ms/tok  "
                      f"valid {r['valid']}  divergence {r['divergence']}", file=sys.stderr, flush=True)
    return out / "rows.jsonl"


def table(path: Path) -> str:
    """The markdown table of a rows.jsonl `measure` wrote, speedups against its `plain` config."""
    results = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    lines = ["| config | tokens | ms/token end to end | ms/token after the first | speedup e2e | speedup after first "
             "| grammar ms/token | acceptance | valid | identical to its backend's plain |", "|---|---|---|---|---|---|---|---|---|---|"]

    def per_token(rs):
        return (sum(r["wall_s"] for r in rs) / sum(r["tokens"] for r in rs),
                sum(r["wall_s"] - r["ttft_s"] for r in rs) / sum(r["tokens"] - 1 for r in rs))
    p_e2e, p_after = per_token([r for r in results if r["config"] == "plain"])
    for name in dict.fromkeys(r["config"] for r in results):
        rs = [r for r in results if r["config"] == name]
        n, (e2e, after) = sum(r["tokens"] for r in rs), per_token(rs)
        acc = sum(r["accepted"] for r in rs) / max(sum(r["proposed"] for r in rs), 1)
        lines.append(f"| {name} | {n} | {1e3 * e2e:.1f} | {1e3 * after:.1f} | {p_e2e / e2e:.2f}x | {p_after / after:.2f}x"
                     f" | {1e3 * sum(r['grammar_s'] for r in rs) / n:.2f} | {acc:.2f} | "
                     f"{sum(r['valid'] for r in rs)}/{len(rs)} | {sum(r['divergence'] is None for r in rs)}/{len(rs)} |")
    prompts = {r["id"]: r["prompt_tokens"] for r in results if "prompt_tokens" in r}  # rows of older runs lack it
    return "\n".join(lines + ([f"median prompt tokens: {statistics.median(prompts.values())}"] if prompts else []))


def json_main(a) -> int:
    if a.table:
        print(table(a.table))
        return 0
    from draftwise.build import EngineSpec, build_engine, load_target
    from draftwise.engine import Engine
    from draftwise.grammar import Grammars
    rows = [json.loads(x) for x in WORKLOAD.read_text().splitlines() if x.strip()][: a.limit]
    engines = {}
    for i, backend in enumerate(a.backends):  # the first backend's configs bare, the others' NAME@BACKEND
        at = "" if i == 0 else f"@{backend}"
        target = load_target(EngineSpec(drafter="none", backend=backend, kernels=a.kernels, max_running=1))
        runner, tok = target
        engines["plain" + at] = Engine(runner, tok, max_running=1)
        for name in a.drafters:  # NAME (D auto) or NAME:D
            d, _, n = name.partition(":")
            engines[name + at] = build_engine(EngineSpec(drafter=d, num_draft_tokens=int(n) if n else "auto",
                                                         backend=backend, kernels=a.kernels, max_running=1),
                                              target=target)[0]
    print(table(measure(engines, tok, Grammars(tok, runner.vocab_size), rows, a.max_tokens, Path(a.out))))
    return 0


S, I = {"type": "string"}, {"type": "integer"}


def obj(props: dict, required=None) -> dict:  # an object schema, every property required unless told
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


PERSON = obj({"name": S, "age": {"type": "integer", "minimum": 0}, "email": S, "skills": {"type": "array", "items": S}})
PERSON_OK = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "skills": ["maths", "poetry", "engines"]}
TOOL = obj({"location": S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": I})
TOOL_OK = {"location": "Paris, France", "unit": "celsius", "days": 3}
ORDERS = obj({"orders": {"type": "array", "items": obj({"id": S, "qty": I, "price": {"type": "number"},
                                                         "shipped": {"type": "boolean"}})}})
ORDERS_OK = {"orders": [{"id": f"A-{i}", "qty": i, "price": 9.5 * i, "shipped": i % 2 == 0} for i in range(1, 6)]}
ANY = {"type": "object"}  # json_object
ANY_OK = {"summary": "a function that adds two numbers", "lines": [1, 2, 3], "ok": True, "extra": None}
TIMED = [("person", PERSON, PERSON_OK), ("tool-args", TOOL, TOOL_OK), ("orders", ORDERS, ORDERS_OK),
         ("json_object", ANY, ANY_OK)]
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
    ("uniqueItems", {"type": "array", "items": I, "uniqueItems": True}, [1, 2], [1, 1]),
    ("prefixItems", {"type": "array", "prefixItems": [S, I], "items": False}, ["a", 1], [1, "a"]),
    ("anyOf", {"anyOf": [S, I]}, 3, True),
    ("oneOf", {"oneOf": [S, I]}, "x", None),
    ("allOf", {"allOf": [{"type": "object", "properties": {"a": S}, "required": ["a"]},
                         {"type": "object", "properties": {"b": S}, "required": ["b"]}]}, {"a": "x", "b": "y"}, {"a": "x"}),
    ("$ref/$defs", {"$defs": {"p": {"type": "object", "properties": {"x": I}, "required": ["x"]}},
                    "$ref": "#/$defs/p"}, {"x": 1}, {"x": "1"}),
    ("recursive $ref", {"$defs": {"n": {"type": "object", "properties": {
        "v": I, "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}, "required": ["v", "kids"]}},
        "$ref": "#/$defs/n"}, {"v": 1, "kids": [{"v": 2, "kids": []}]}, {"v": 1, "kids": [{"v": "2"}]}),
    ("additionalProperties schema", {"type": "object", "additionalProperties": I}, {"a": 1}, {"a": "x"}),
    ("patternProperties", {"type": "object", "patternProperties": {"^x_": I}, "additionalProperties": False},
     {"x_a": 1}, {"y": 1}),
    ("optional properties", obj({"a": S, "b": S}, ["a"]), {"a": "x"}, {"b": "x"}),
    ("type list (nullable)", {"type": ["string", "null"]}, None, 1),
    ("if/then/else", {"if": I, "then": {"minimum": 0}, "else": S}, 1, -1),
    ("not", {"not": S}, 1, "x"),
    ("dependentRequired", {"type": "object", "properties": {"a": S, "b": S}, "dependentRequired": {"a": ["b"]}},
     {"a": "x", "b": "y"}, {"a": "x"}),
]


class _Engine:
    def rollback(self, m, n):
        m.rollback(n)


class LLG(_Engine):
    name = "llguidance"

    def __init__(self, hf, vocab):
        import llguidance
        self.llg, self.vocab, self.tok = llguidance, vocab, self.tokenizer(hf, vocab)

    @staticmethod
    def tokenizer(hf, vocab):
        import llguidance.hf
        return llguidance.hf.from_tokenizer(hf, n_vocab=vocab)

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


class XGR(_Engine):
    name = "xgrammar"

    def __init__(self, hf, vocab):
        import xgrammar as xgr
        self.xgr, self.vocab = xgr, vocab
        self.compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab))
        self.bits = xgr.allocate_token_bitmask(1, vocab)

    def matcher(self, schema):
        cg = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(", ", ": "))
        return self.xgr.GrammarMatcher(cg, max_rollback_tokens=64)

    def mask(self, m):
        m.fill_next_token_bitmask(self.bits)
        return np.unpackbits(self.bits.numpy().view(np.uint8), bitorder="little")[: self.vocab]

    def consume(self, m, toks) -> bool:
        return all(m.accept_token(t) for t in toks)  # stops at the first refused token


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
        wrong = bool(engine.mask(m)[hf.eos_token_id]) if hf.eos_token_id is not None else True
    return "enforced" if ok and not wrong else ("valid refused" if not ok else "ignored")


def compare(hf, vocab: int, repeats: int, kinds=(LLG, XGR), cases=TIMED, features=FEATURES) -> None:
    """Prints the timing table and the coverage table of the engines in `kinds` that are installed."""
    engines = []
    for cls in kinds:
        t = time.perf_counter()
        try:
            engines.append(cls(hf, vocab))
        except ImportError as e:
            print(f"{cls.name}: not installed, skipped ({e})")
            continue
        print(f"{cls.name}: tokenizer set-up {time.perf_counter() - t:.2f} s")
    print("\n| engine | schema | compile ms | answer tokens | mask ms/token (median) | max | consume 8 + rollback 8 ms |")
    print("|---|---|---|---|---|---|---|")
    for e in engines:
        for name, schema, inst in cases:
            c, n, med, mx, walk = timed(e, hf, schema, inst, repeats)
            print(f"| {e.name} | {name} | {c:.1f} | {n} | {med:.3f} | {mx:.2f} | {walk:.3f} |")
    print("\n| feature | " + " | ".join(e.name for e in engines) + " |")
    print("|---|" + "---|" * len(engines))
    for name, schema, good, bad in features:
        print(f"| {name} | " + " | ".join(enforced(e, hf, schema, good, bad) for e in engines) + " |")


def peers(run: Path) -> str:
    """A `server_bench.py --api chat` run over the JSON and tool-call rows: per server and kind, the
    answers, their validity (JSON: against the row's schema; tools: calls read back into
    tool_calls, each call's arguments against its function's parameters), tokens, and seconds per
    answer end to end, after the first token and to it. Validity is llguidance's, on a grammar of
    the same schema with JSON's whitespace free (servers lay JSON out as they like)."""
    from draftwise.grammar import Grammars
    from draftwise.prompts import load_workload
    tok = load_tokenizer()
    grammars, recs = Grammars(tok, 151936), [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
    rows = {p.id: p for p in load_workload(next(r for r in recs if r["kind"] == "session")["plan"]["workload"])}

    def valid(schema: dict, text: str) -> bool:
        c = grammars.json_schema(schema, free_layout=True).start()
        try:
            c.advance(tok.encode(text.strip()))
        except RuntimeError:
            return False
        return c.m.is_accepting()

    def ok(r: dict) -> bool:
        p = rows[r["prompt_id"]]
        if not p.tools:
            return valid(p.response_format["json_schema"]["schema"], r["text"])
        params = {t["function"]["name"]: t["function"]["parameters"] for t in p.tools}
        calls = r.get("tool_calls") or []
        return bool(calls) and all(c["name"] in params and valid(params[c["name"]], c["arguments"]) for c in calls)

    lines = ["| server | kind | answers | valid | tokens | s per answer e2e | after the first token | TTFT |",
             "|---|---|---|---|---|---|---|---|"]
    reqs = [r for r in recs if r["kind"] == "request"]
    for kind in ("json", "tools"):
        for name in dict.fromkeys(r["config"] for r in reqs):
            rs = [r for r in reqs if r["config"] == name and bool(rows[r["prompt_id"]].tools) == (kind == "tools")]
            if rs:
                e2e, ttft = sum(r["e2e_s"] for r in rs) / len(rs), sum(r["ttft_s"] for r in rs) / len(rs)
                lines.append(f"| {name} | {kind} | {len(rs)} | {sum(map(ok, rs))} | {sum(r['emitted_tokens'] for r in rs)}"
                             f" | {e2e:.2f} | {e2e - ttft:.2f} | {ttft:.2f} |")
    return "\n".join(lines)


# llama.cpp, Qwen2.5-Coder-1.5B, repacked kernels, the EPYC type (docs/design.md): ms per forward of k
CURVE = "1:27,2:48,4:76,8:132,16:156"
WAYS = ("separate", "then-draft", "interleaved")


def cost_curve(text: str):
    """'k:ms,...' -> k -> ms, linear between the points, flat past the last."""
    pts = sorted((int(k), float(ms)) for k, ms in (p.split(":") for p in text.split(",")))
    ks, ms = [k for k, _ in pts], [m for _, m in pts]
    return lambda k: float(np.interp(k, ks, ms))


def replay(out: list[int], prompt: list[int], forced: list[list[int]], way: str, cost, max_draft: int,
           propose) -> float:
    """ms to emit out[1:] (out[0] comes from the prefill) one way; forced[i]: the grammar's run at i."""
    i, ms = 1, 0.0
    while i < len(out):
        j = i  # the round verifies out[i:j] and emits out[j] as its bonus
        while j - i < max_draft and j < len(out):
            run = forced[j][: max_draft - (j - i)]
            if run:  # the grammar's run: the round ends where the answer left it, or after it (separate)
                a = common_prefix(run, out[j:])
                j += a
                if a < len(run) or way == "separate":
                    break
                continue
            a = common_prefix(propose(prompt + out[:j], max_draft - (j - i)), out[j:])
            j += a
            if not a or way != "interleaved":
                break
        ms += cost(1 + j - i)
        i = j + 1
    return ms


def forced_main(a) -> int:
    from draftwise.drafters.ngram import ngram_propose
    from draftwise.grammar import Grammars

    tok, cost = load_tokenizer(), cost_curve(a.curve)
    grammars = Grammars(tok, 151936)  # the model's logits width
    work = {r["id"]: r for r in map(json.loads, filter(str.strip, WORKLOAD.read_text().splitlines()))}
    answers = [r for r in map(json.loads, filter(str.strip, a.rows.read_text().splitlines())) if r["config"] == "plain"]
    propose = lambda ctx, n: ngram_propose(np.asarray(ctx, dtype=np.int64), 2, 4, n).tolist() if n > 0 else []  # noqa: E731
    ms, tokens, forced_tokens = dict.fromkeys(WAYS, 0.0), 0, 0
    for r in answers:
        row = work[r["id"]]
        out = tok.encode(r["text"]) + [min(tok.eos_token_ids)]  # the answer and its end
        state, forced = grammars.json_schema(row["response_format"]["json_schema"]["schema"]).start(), []
        for t in out:
            forced.append(state.forced(a.max_draft))
            state.advance([t])
        prompt = tok.apply_chat(row["messages"])
        for way in WAYS:
            ms[way] += replay(out, prompt, forced, way, cost, a.max_draft, propose)
        tokens += len(out) - 1
        forced_tokens += sum(1 for i in range(1, len(out)) if forced[i] and forced[i][0] == out[i])
    plain = cost(1) * tokens
    print(f"{len(answers)} answers, {tokens} tokens after the first, {forced_tokens / tokens:.0%} of them forced; "
          f"n-gram drafts sized by an oracle; curve {a.curve}")
    for way in WAYS:
        print(f"{way:12s} {plain / ms[way]:.3f}x constrained plain")
    return 0



def load_tokenizer():
    """The packaged Qwen2.5-Coder tokenizer (draftwise.tokenizer.Tokenizer; `.hf`: transformers')."""
    from draftwise.models.load import load_tokenizer as lt
    from draftwise.models.registry import resolve
    return lt(resolve("qwen2.5-coder-1.5b"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    j = sub.add_parser("json", help="constrained plain vs speculative decoding on the JSON-extraction workload")
    j.add_argument("--out", default="docs/data/agents_json")
    j.add_argument("--drafters", nargs="+", default=["ngram", "suffix"], help="NAME (D auto) or NAME:D each")
    j.add_argument("--max-tokens", type=int, default=160)
    j.add_argument("--kernels", default="repacked")
    j.add_argument("--backends", nargs="+", default=["llama.cpp"],
                   help="each backend's configs in the same run, interleaved per row (llama.cpp onnx)")
    j.add_argument("--limit", type=int, default=None)
    j.add_argument("--table", metavar="ROWS", help="print the table of a saved rows.jsonl and stop")
    e = sub.add_parser("engines", help="llguidance vs xgrammar: mask time and schema coverage")
    e.add_argument("--repeats", type=int, default=3)
    fr = sub.add_parser("forced", help="forced runs joined with drafts, replayed on a json run's answers")
    fr.add_argument("rows", type=Path, help="a `json` run's rows.jsonl (its plain answers)")
    fr.add_argument("--curve", default=CURVE, help=f"ms per forward of k tokens, k:ms,... (default {CURVE})")
    fr.add_argument("--max-draft", type=int, default=8)
    pr = sub.add_parser("peers", help="validity and seconds per answer of a server_bench.py --api chat run")
    pr.add_argument("run", type=Path)
    a = ap.parse_args(argv)
    if a.cmd == "forced":
        return forced_main(a)
    if a.cmd == "peers":
        print(peers(a.run))
        return 0
    if a.cmd == "engines":  # 151936: the model's logits width (the tokenizer holds 151,665)
        return compare(load_tokenizer().hf, 151936, a.repeats) or 0
    return json_main(a)


if __name__ == "__main__":
    sys.exit(main())
