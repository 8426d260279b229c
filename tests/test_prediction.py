"""Predicted Outputs: the prediction drafter's cursor (follow, re-alignment after an insertion, a
deletion, a rewrite), the usage counts, greedy identity with plain decoding through the composed
drafter and its routing policy, and requests without a prediction drafted exactly as uncomposed."""
import pytest
import torch

from draftwise.build import with_prediction
from draftwise.choice import DrafterChoice
from draftwise.costs import CostCurve
from draftwise.drafters.auto import AutoDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.prediction import PredictionCounts, PredictionDrafter, prediction_counts
from draftwise.engine import Engine
from draftwise.planner import Planner
from draftwise.policy import FixedDraftLength, PlannedDraftLength
from draftwise.prediction_policy import PredictionRouting
from draftwise.sampling import SamplingParams
from fakes import CharTokenizer, CycleRunner

PRED = [10, 11, 12, 13, 14, 15, 16]
PROMPT = [0, 1, 2]


def drafts(outputs: list[list[int]], pred=PRED, n=8) -> list[list[int]]:
    """The drafter's proposal after each output so far (one request, its prediction `pred`)."""
    d = PredictionDrafter()
    d.predict(7, pred, len(PROMPT))
    return [d.propose(7, PROMPT + out, n, SamplingParams(), None).tokens for out in outputs]


def test_the_cursor_follows_the_output_through_the_prediction():
    assert drafts([[10], [10, 11, 12], [10, 11, 12, 13, 14, 15, 16]], n=3) == [[11, 12, 13], [13, 14, 15], []]


def test_a_rewritten_token_loses_the_cursor_until_the_output_meets_the_prediction_again():
    # 12 rewritten as 99: nothing matches [.. 99] nor [99 13]; then [13 14] is found ahead
    assert drafts([[10, 11, 99], [10, 11, 99, 13], [10, 11, 99, 13, 14]]) == [[], [], [15, 16]]


def test_an_insertion_and_a_deletion_re_align():
    assert drafts([[10, 11, 98, 97], [10, 11, 98, 97, 12, 13]]) == [[], [14, 15, 16]]  # inserted 98 97
    assert drafts([[10, 11, 14], [10, 11, 14, 15]]) == [[], [16]]  # 12 13 deleted


def test_re_alignment_looks_forward_from_where_it_was_lost_first():
    pred = [4, 9, 5, 6, 7, 5, 6, 8]  # [5 6] occurs twice: the n-gram drafter's most recent would draft [8]
    assert drafts([[4, 99, 5, 6]], pred) == [[7, 5, 6, 8]]
    # ... but the longest match wins over the nearest: [7 5 6] occurs only before the 8
    assert drafts([[4, 99, 7, 5, 6]], pred) == [[8]]
    # and nothing ahead of where it was lost (the end): the match before it
    assert drafts([[4, 9, 5, 6, 7, 5, 6, 8, 99, 9, 5]], pred) == [[6, 7, 5, 6, 8]]


def test_no_prediction_no_drafts_and_an_empty_one_forgets_the_last():
    d = PredictionDrafter()
    assert d.propose(1, PROMPT + [10], 4, SamplingParams(), None).tokens == []
    d.predict(1, PRED, len(PROMPT))
    d.predict(1, [], len(PROMPT))  # a kept prompt's key, reused by a request without one
    assert d.propose(1, PROMPT + [10], 4, SamplingParams(), None).tokens == []
    d.predict(2, PRED, len(PROMPT))
    d.release(2)
    assert d.propose(2, PROMPT + [10], 4, SamplingParams(), None).tokens == []


def test_usage_counts_the_prediction_tokens_that_appeared_in_the_completion():
    assert prediction_counts([1, 2, 3, 4], [1, 2, 9, 4, 5]) == PredictionCounts(3, 1)
    assert prediction_counts([1, 2, 3], []) == PredictionCounts(0, 3)
    assert prediction_counts([5, 6, 7, 8], [7, 8, 5, 6]) == PredictionCounts(2, 2)  # in order: one block of two


class ScriptRunner(CycleRunner):
    """The next token at position i is script[i]: an output no n-gram over the prompt predicts."""
    trees = False

    def __init__(self, script, **kw):
        super().__init__(vocab=16, **kw)
        self.script = script

    def forward(self, seq_ids, tokens, num_logits, parents=None):
        self.forwards.append(list(seq_ids))
        out = []
        for s, toks, k in zip(seq_ids, tokens, num_logits):
            start = len(self.seqs[s])
            self.seqs[s] += toks
            rows = []
            for j in range(len(toks) - k, len(toks)):  # token at start + j predicts the next position
                row = torch.zeros(self.vocab_size)
                row[self.script[(start + j + 1) % len(self.script)]] = self.sharp
                rows.append(row)
            out.append(torch.stack(rows) if rows else torch.zeros(0, self.vocab_size))
        return out


SCRIPT = [int(x) for x in torch.randint(0, 15, (120,), generator=torch.Generator().manual_seed(3))]
START = 8  # the prompt: SCRIPT[:8]; the output: SCRIPT[8:]


def planner(prior):
    curve = CostCurve({1: [10.0 + 0.5 * k for k in range(33)]})
    return Planner(curve, None, prior=prior, max_draft=16, online=False)


def routed(drafter):
    return PredictionRouting(PlannedDraftLength(planner((0.4,) + (0.75,) * 15)),
                             DrafterChoice({"ngram": planner((0.4,) + (0.75,) * 15),
                                            "prediction": planner((0.6,) + (0.9,) * 15)}), "ngram")


@pytest.mark.parametrize("edit", ["same", "rewrite", "insert", "delete"])
def test_greedy_output_with_a_prediction_equals_plain_and_drafts_from_it(edit):
    out = SCRIPT[START:START + 60]
    pred = {"same": out, "rewrite": out[:20] + [15, 15, 15] + out[23:],
            "insert": out[:20] + [1, 2, 3, 4] + out[20:], "delete": out[:20] + out[30:]}[edit]
    plain = Engine(ScriptRunner(SCRIPT), CharTokenizer()).generate(SCRIPT[:START], max_tokens=60)
    drafter = with_prediction(NgramDrafter(1, 3))
    r = Engine(ScriptRunner(SCRIPT), CharTokenizer(), drafter, "auto", policy=routed(drafter)).generate(
        SCRIPT[:START], max_tokens=60, prediction=pred)
    assert r.token_ids == plain.token_ids == out
    chosen = [p.drafter for p in r.decisions]
    assert chosen.count("prediction") >= 4 and r.stats.accepted_draft_tokens >= 40, chosen
    assert r.stats.verification_rounds <= 16  # 60 tokens in at most 16 rounds after the prefill


def test_fixed_d_takes_the_longer_proposal_and_stays_exact():
    out = SCRIPT[START:START + 40]
    plain = Engine(ScriptRunner(SCRIPT), CharTokenizer()).generate(SCRIPT[:START], max_tokens=40)
    r = Engine(ScriptRunner(SCRIPT), CharTokenizer(), with_prediction(NgramDrafter(1, 3)), 8,
               policy=FixedDraftLength(8)).generate(SCRIPT[:START], max_tokens=40, prediction=out[:10] + out[12:])
    assert r.token_ids == plain.token_ids and r.stats.accepted_draft_tokens >= 25


def test_a_request_without_a_prediction_is_drafted_exactly_as_by_the_drafter_alone():
    prompt = [0, 1, 2, 3, 4, 0, 1]  # CycleRunner: n-gram drafts pay here
    alone = Engine(CycleRunner(), CharTokenizer(), NgramDrafter(1, 3), "auto",
                   policy=PlannedDraftLength(planner((0.4,) + (0.75,) * 15))).generate(prompt, max_tokens=50)
    drafter = with_prediction(NgramDrafter(1, 3))
    composed = Engine(CycleRunner(), CharTokenizer(), drafter, "auto", policy=routed(drafter)).generate(
        prompt, max_tokens=50)
    assert composed.token_ids == alone.token_ids
    assert [(p.d, p.proposed, p.drafter) for p in composed.decisions] == \
        [(p.d, p.proposed, p.drafter) for p in alone.decisions]
    assert composed.rounds == alone.rounds and alone.stats.accepted_draft_tokens > 20


def test_with_prediction_composes_cheap_chain_drafters_only():
    d = with_prediction(NgramDrafter())
    assert isinstance(d, AutoDrafter) and d.name == "ngram" and d.base == "ngram"
    assert set(d.members) == {"ngram", "prediction"} and d.cheap and not d.tree
    assert with_prediction(None) is None
    with pytest.raises(ValueError, match="base 'x' is not among"):
        AutoDrafter({"ngram": NgramDrafter()}, base="x")


def test_a_prediction_too_long_for_the_context_or_out_of_the_vocabulary_is_refused():
    eng = Engine(CycleRunner(max_context=64), CharTokenizer(), with_prediction(NgramDrafter()), 4)
    with pytest.raises(ValueError, match=r"prompt \(3 tokens\) \+ prediction \(70 tokens\) = 73 exceeds the "
                                         r"context of 64 tokens; send a shorter prediction"):
        eng.generate([0, 1, 2], max_tokens=4, prediction=[1] * 70)
    with pytest.raises(ValueError, match=r"prediction token ids out of range \[0, 16\): \[99\]"):
        eng.generate([0, 1, 2], max_tokens=4, prediction=[1, 99])


def test_bench_sends_a_rows_prediction_from_configurations_that_ask(tmp_path):
    import json

    from draftwise.bench.config import BenchConfig, RunConfig
    from draftwise.bench.run import run_bench
    from draftwise.prompts import from_jsonl

    assert RunConfig.parse("ngram:2,auto+prediction") == [RunConfig("ngram:2+prediction", "ngram", 2, True),
                                                          RunConfig("ngram:auto+prediction", "ngram", "auto", True)]
    chars = lambda ids: "".join(chr(ord("a") + t) for t in ids)  # noqa: E731 - CharTokenizer's text
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"id": "p", "category": "edit", "prompt": chars(SCRIPT[:START]),
                                "prediction": chars(SCRIPT[START:START + 30])}) + "\n")
    assert from_jsonl(path)[0].prediction == chars(SCRIPT[START:START + 30])
    runner, tok = ScriptRunner(SCRIPT), CharTokenizer()
    engines = {"plain": Engine(runner, tok), "ngram:4": Engine(runner, tok, with_prediction(NgramDrafter(1, 3)), 4),
               "ngram:4+prediction": Engine(runner, tok, with_prediction(NgramDrafter(1, 3)), 4)}
    cfg = BenchConfig(target="fake", workload=str(path), n_per_category=None, max_tokens=30,
                      configs=tuple(engines), out_dir=str(tmp_path / "out"), context_edges=(8,), warmup=0)
    out = run_bench(cfg, engines=engines, tokenizer=tok, progress=False)
    recs = {r["config"]: r for r in map(json.loads, open(out)) if r["kind"] == "request"}
    assert recs["plain"]["token_ids"] == recs["ngram:4"]["token_ids"] == recs["ngram:4+prediction"]["token_ids"]
    assert recs["ngram:4+prediction"]["stats"]["accepted_draft_tokens"] >= 20  # 29 tokens after the first
    assert recs["ngram:4"]["stats"]["accepted_draft_tokens"] < 10  # no prediction sent: n-gram alone
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "ab", "prediction": ["a"]}) + "\n")
    with pytest.raises(ValueError, match="'prediction' must be a string"):
        from_jsonl(bad)


def test_a_batch_mixing_requests_with_and_without_a_prediction_stays_exact():
    out = SCRIPT[START:START + 40]
    runner, tok = ScriptRunner(SCRIPT), CharTokenizer()
    plain = Engine(runner, tok).generate(SCRIPT[:START], max_tokens=40)
    drafter = with_prediction(NgramDrafter(1, 3))
    eng = Engine(runner, tok, drafter, "auto", policy=routed(drafter))
    got = {}
    reqs = [eng.request(SCRIPT[:START], lambda ev, i=i: got.__setitem__(i, ev.result) if ev.result else None,
                        max_tokens=40, prediction=out if i % 2 else None) for i in range(4)]
    eng.run_batch(reqs)
    assert all(got[i].token_ids == plain.token_ids for i in range(4))
    assert all(got[i].stats.accepted_draft_tokens >= 30 for i in (1, 3))  # drafted from their predictions
    assert all({p.drafter for p in got[i].decisions} == {None} for i in (0, 2))  # n-gram alone
