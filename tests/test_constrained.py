"""Constrained speculation through the loop (draftwise.constrained, draftwise.scheduler) on fake
models: greedy identity with constrained plain decoding, schema-valid outputs, forced runs as
free drafts, the output distribution at T > 0 against the exact one, and a wrong rule caught."""
import json
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

pytest.importorskip("llguidance")

from draftwise.drafters.base import DraftItem  # noqa: E402
from draftwise.drafters.model import ModelDrafter  # noqa: E402
from draftwise.engine import Engine  # noqa: E402
from draftwise.grammar import Grammars  # noqa: E402
from draftwise.losscheck import BUGS  # noqa: E402
from draftwise.sampling import SamplingParams, mask_logits, warp  # noqa: E402
from fakes import CheapDrafter  # noqa: E402
from grammar_fakes import PIECES, JsonTokenizer, TableDrafter, TableRunner  # noqa: E402

TOK = JsonTokenizer()
PAIR = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"type": "boolean"}},
        "required": ["a", "b"], "additionalProperties": False}
LIST = {"type": "object", "properties": {"xy": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                                                "maxItems": 3},
                                         "c": {"enum": ["ab", "c"]}},
        "required": ["xy", "c"], "additionalProperties": False}


def valid(schema, text) -> bool:
    """The two test schemas, checked by hand (no validator is a dependency)."""
    try:
        v = json.loads(text)
    except json.JSONDecodeError:
        return False
    if schema is PAIR:
        return set(v) == {"a", "b"} and isinstance(v["a"], str) and len(v["a"]) <= 4 and isinstance(v["b"], bool)
    return (set(v) == {"xy", "c"} and isinstance(v["xy"], list) and len(v["xy"]) <= 3
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= 99 for x in v["xy"]) and v["c"] in ("ab", "c"))


@pytest.fixture(scope="module")
def grammars():
    return Grammars(TOK, len(PIECES))


class Empty(CheapDrafter):
    """Proposes nothing: only the grammar's forced runs are drafted."""
    calls = 0

    def propose(self, *a, **kw):
        Empty.calls += 1
        return super().propose(*a, **kw)


@pytest.mark.parametrize("schema", [PAIR, LIST])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_speculation_is_constrained_plain_greedy(grammars, schema, seed):
    g = grammars.json_schema(schema)
    plain = Engine(TableRunner(seed=seed), TOK, None, 0).generate([0], max_tokens=60, constraint=g)
    for drafter, d in ((TableDrafter(seed=seed + 10), 4), (Empty(), 4), (TableDrafter(seed=seed), 8),
                       (ModelDrafter(TableRunner(seed=seed + 10)), 4)):
        spec = Engine(TableRunner(seed=seed), TOK, drafter, d).generate([0], max_tokens=60, constraint=g)
        assert spec.token_ids == plain.token_ids, drafter
    assert plain.finish_reason == "stop" and valid(schema, plain.text), plain.text


def test_forced_runs_are_drafts_that_cost_no_drafting(grammars):
    g = grammars.json_schema(PAIR)
    res = Engine(TableRunner(), TOK, Empty(), 4).generate([0], max_tokens=60, constraint=g)
    forced = [r for r in res.rounds if r.proposed]
    assert forced and sum(r.accepted for r in forced) >= 2  # 'a' and '": ' after the first '{"'
    # a greedy target follows every forced token here: the grammar allows nothing else
    assert all(r.accepted == r.proposed for r in forced)
    plain = Engine(TableRunner(), TOK, None, 0).generate([0], max_tokens=60, constraint=g)
    assert not plain.rounds  # plain decoding stays plain: no drafter, no forced runs


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0)])
def test_a_draft_model_draws_each_token_from_its_masked_q(grammars, params):
    """Under a grammar a draft model draws token i from q' = norm(q * mask), the mask after the
    draft's tokens before i: its draft is never cut (the same model unmasked is, at its first
    refused token), q' puts nothing on a refused token, and the grammar's state is left as it was
    once the loop rolls the walk back (settle)."""
    g = grammars.json_schema(PAIR)
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    c = g.start()
    c.advance(TOK.encode('{"a'))
    masked = ModelDrafter(TableRunner(seed=11)).propose_many([DraftItem(0, [0], 8, params, gen(), None, c)])[0]
    c.settle(0, [])
    masks = c.walk(masked.tokens)  # [d+1, V]: the grammar allows every token drafted
    assert len(masked.tokens) == 8 and masks.shape[0] == 9
    if masked.probs is not None:
        assert float((masked.probs * ~masks[:8]).sum()) == 0.0
        assert torch.allclose(masked.probs.sum(-1), torch.ones(8))
    c.settle(0, [])
    free = ModelDrafter(TableRunner(seed=11)).propose(0, [0], 8, params, gen())
    assert c.walk(free.tokens).shape[0] - 1 < 8  # unmasked, the grammar cuts it
    c.settle(0, [])


def test_an_answer_cut_by_max_tokens_ends_with_length(grammars):
    g = grammars.json_schema(PAIR)
    for drafter, d in ((None, 0), (TableDrafter(), 4)):
        res = Engine(TableRunner(), TOK, drafter, d).generate([0], max_tokens=5, constraint=g)
        assert res.finish_reason == "length" and len(res.token_ids) == 5


@pytest.mark.parametrize("schema", [PAIR, LIST])
def test_every_sampled_answer_is_valid(grammars, schema):
    g = grammars.json_schema(schema)
    eng = Engine(TableRunner(scale=1.0), TOK, TableDrafter(scale=1.0), 4)
    done = 0
    for seed in range(40):
        res = eng.generate([0], max_tokens=80, temperature=1.0, seed=seed, constraint=g)
        if res.finish_reason == "stop":
            done += 1
            assert valid(schema, res.text), res.text
        else:  # cut by max_tokens: a prefix of a valid answer
            c = g.start()
            c.advance(res.token_ids)
    assert done >= 30


def exact(runner, g, prompt_last, n, params):
    """{first n tokens: probability} of constrained sampling, enumerated (logits follow the last token)."""
    out, c = {}, g.start()

    def go(prefix, last, prob):
        if len(prefix) == n:
            out[tuple(prefix)] = prob
            return
        p = warp(mask_logits(runner.logits_after(last)[None], c.allowed()[None]), params)[0]
        for t in torch.nonzero(p > 1e-6).flatten().tolist():
            c.advance([t])
            go(prefix + [t], t, prob * float(p[t]))
            c.rollback(1)
    go([], prompt_last, 1.0)
    return out


def draws(engine, g, n, samples, params):
    return [tuple(engine.generate([0], max_tokens=n + 4, temperature=params.temperature, seed=s,
                                  constraint=g).token_ids[:n]) for s in range(samples)]


def gof(outs: list[tuple], probs: dict, n: int) -> float:
    """The smallest chi-square goodness-of-fit p-value over output positions 0..n-1 (each token's
    marginal; categories expected < 5 times pooled), Bonferroni-corrected."""
    worst = 1.0
    for j in range(n):
        marginal = Counter()
        for k, p in probs.items():
            marginal[k[j]] += p
        counts = Counter(o[j] for o in outs)
        big = [t for t, p in marginal.items() if p * len(outs) >= 5]
        if len(big) < 2:
            continue  # the grammar fixes this position (or nearly)
        obs = [counts[t] for t in big] + [len(outs) - sum(counts[t] for t in big)]
        exp = [marginal[t] * len(outs) for t in big] + [len(outs) * (1 - sum(marginal[t] for t in big))]
        if exp[-1] < 1e-9:
            obs, exp = obs[:-1], exp[:-1]
        exp = [e * sum(obs) / sum(exp) for e in exp]  # the enumeration dropped tokens below 1e-6
        worst = min(worst, float(chisquare(obs, exp).pvalue) * n)
    return worst


@pytest.mark.parametrize("drafter", [lambda: TableDrafter(scale=1.5), lambda: ModelDrafter(TableRunner(seed=1, scale=1.5))],
                         ids=["cut-at-refusal", "draft-model-masked"])
def test_sampled_output_follows_the_exact_constrained_distribution_and_a_wrong_rule_does_not(grammars, drafter):
    """Either way a drafter meets the grammar (its draft cut at the first refused token, or each
    token drawn from its masked q'), the output is the constrained target's distribution."""
    g = grammars.json_schema(PAIR)
    params, n, samples = SamplingParams(temperature=1.0), 7, 1200
    probs = exact(TableRunner(scale=1.5), g, 0, n, params)
    assert abs(sum(probs.values()) - 1) < 1e-3
    good = Engine(TableRunner(scale=1.5), TOK, drafter(), 4)
    assert gof(draws(good, g, n, samples, params), probs, n) > 1e-3
    bad = Engine(TableRunner(scale=1.5), TOK, drafter(), 4, **BUGS["resample-from-p"])
    assert gof(draws(bad, g, n, samples, params), probs, n) < 1e-3  # seeded: the same draws every run


@pytest.mark.parametrize("bug, verdict", [(None, "PASS"), ("resample-from-p", "FAIL")])
def test_verify_in_constrained_mode_passes_the_rule_and_flags_the_bug(grammars, bug, verdict):
    from draftwise.losscheck import check_greedy, check_sampling

    g, target = grammars.json_schema(PAIR), TableRunner(scale=1.5)
    plain = Engine(target, TOK, reuse_prefix=True)
    # the target's own table, sharper: q near one-hot on the target's favourite, which the bug biases most
    spec = Engine(target, TOK, TableDrafter(seed=0, scale=3.0), 4, reuse_prefix=True, **(BUGS[bug] if bug else {}))
    rep = check_sampling(plain, spec, [[0]], temperature=1.0, positions=6, samples=600, min_tv=0.12, constraint=g)
    assert rep.verdict == verdict, rep.summary()
    assert not rep.bug_bias  # the bug's predicted bias ignores the mask: not reported in this mode
    assert check_greedy(plain, spec, [[0], [3]], max_tokens=40, constraint=g).verdict == "PASS"


def test_the_cli_takes_a_schema_file_or_json_object(tmp_path):
    from draftwise.cli import _constraint, build_parser

    path = tmp_path / "schema.json"
    path.write_text(json.dumps(PAIR))
    ap = build_parser()
    a = ap.parse_args(["generate", "--json-schema", str(path)])
    g = _constraint(a, TOK, TableRunner())
    assert g.kind == "json_schema" and g.start().forced(3) == TOK.encode('{"a": ')
    assert _constraint(ap.parse_args(["verify", "--json-object"]), TOK, TableRunner()) is not None
    assert _constraint(ap.parse_args(["generate"]), TOK, TableRunner()) is None
    with pytest.raises(SystemExit):
        ap.parse_args(["generate", "--json-object", "--json-schema", str(path)])


def test_bench_answers_a_rows_response_format_under_its_schema_in_every_configuration(tmp_path):
    from draftwise.bench.config import BenchConfig
    from draftwise.bench.run import run_bench
    from draftwise.prompts import from_jsonl

    fmt = {"type": "json_schema", "json_schema": {"name": "pair", "strict": True, "schema": PAIR}}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"id": "j", "category": "json", "prompt": "ab", "response_format": fmt}) + "\n"
                    + json.dumps({"id": "t", "category": "text", "prompt": "ab"}) + "\n")
    assert [p.response_format for p in from_jsonl(path)] == [fmt, None]
    runner = TableRunner(seed=0)
    engines = {"plain": Engine(runner, TOK), "ngram:4": Engine(runner, TOK, TableDrafter(seed=10), 4)}  # a table drafter
    cfg = BenchConfig(target="fake", workload=str(path), n_per_category=None, max_tokens=60, configs=tuple(engines),
                      out_dir=str(tmp_path / "out"), context_edges=(8,), warmup=1)
    recs = [json.loads(x) for x in open(run_bench(cfg, engines=engines, tokenizer=TOK, progress=False))]
    by = {(r["prompt_id"], r["config"]): r for r in recs if r["kind"] == "request"}
    plain = Engine(TableRunner(seed=0), TOK).generate(TOK.encode("ab"), max_tokens=60,
                                                      constraint=Grammars(TOK, len(PIECES)).json_schema(PAIR))
    for c in engines:
        assert by[("j", c)]["token_ids"] == plain.token_ids and valid(PAIR, by[("j", c)]["text"]), c
        assert not valid(PAIR, by[("t", c)]["text"])  # the row without one decodes free
    for bad, problem in (({"type": "json_schema"}, "json_schema.schema"), ("json", "must be an object"),
                         ({"type": "yaml"}, "text, json_object or json_schema")):
        path.write_text(json.dumps({"prompt": "ab", "response_format": bad}) + "\n")
        with pytest.raises(ValueError, match=problem):
            from_jsonl(path)


def test_a_constrained_divergence_margin_is_taken_among_the_tokens_the_grammar_allows(grammars):
    from draftwise.compare import divergence_report

    runner, prompt, common = TableRunner(seed=3), TOK.encode("ab"), TOK.encode('{"a": "')
    g = grammars.json_schema(PAIR)
    c = g.start()
    c.advance(common)
    allowed = c.allowed()  # [V]: what the string value may go on with
    ok = allowed.nonzero().flatten().tolist()
    row = runner.logits_after(common[-1])
    top = torch.topk(row.masked_fill(~allowed, float("-inf")), 2).values
    plain, spec = common + [ok[0]], common + [ok[1]]
    d = divergence_report(runner, prompt, plain, spec, g)
    assert 1 < len(ok) < len(PIECES) and d.position == len(common)
    assert d.margin_single == pytest.approx(float(top[0] - top[1])) == pytest.approx(d.margin_batched)
    unmasked = divergence_report(runner, prompt, plain, spec)
    assert unmasked.margin_single == pytest.approx(float(row.topk(2).values.diff().neg()))
    assert unmasked.margin_single != pytest.approx(d.margin_single)  # the table's best tokens are refused there
