"""The lossless check's statistics, and the check itself on a toy model with a real and a wrong sampler."""
import random

import numpy as np
import pytest
import torch

from draftwise.bugbias import bug_shift, bug_tv, predict_bug_bias, shift_tv
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.losscheck import (check_greedy, check_sampling, homogeneity_test, required_samples,
                                 resample_from_p)
from draftwise.sampling import SamplingParams
from draftwise.verify import rejection_sample
from fakes import CharTokenizer, CycleRunner


def test_required_samples_formula():
    # (z_{0.975} + z_{0.8})^2 / (2 * 0.1^2) = (1.95996 + 0.84162)^2 / 0.02 = 392.4
    assert required_samples(0.1) == 393
    # Bonferroni over 4 tests: (z_{1 - 0.05/8} + z_{0.8})^2 / 0.02 = (2.49771 + 0.84162)^2 / 0.02 = 557.6
    assert required_samples(0.1, n_tests=4) == 558
    with pytest.raises(ValueError):
        required_samples(0.0)


def test_homogeneity_test_detects_a_shift_and_pools_rare_tokens():
    rng = random.Random(0)
    w = [50, 30, 19, 0.5, 0.5]  # tokens 3 and 4 are rare: expected counts under 5 get pooled
    a = rng.choices(range(5), weights=w, k=600)
    b = rng.choices(range(5), weights=w, k=600)
    c = rng.choices(range(5), weights=[40, 40, 19, 0.5, 0.5], k=600)
    p_same, _, _, cats = homogeneity_test(a, b)
    assert p_same > 0.01 and cats == 4  # tokens 3 and 4 pooled into one category
    p_diff, g_diff, _, _ = homogeneity_test(a, c)
    assert p_diff < 1e-3 and g_diff < 1e-3


def _toy_engines(sampler):
    """A sharp target (p = 0.8 on the next token of the cycle) drafted by a uniform model:
    most drafts are rejected, and resampling from p shifts P(next) from 0.8 to about 0.67."""
    target = CycleRunner(vocab=6, period=5, sharp=3.0)
    draft = CycleRunner(vocab=6, period=5, sharp=0.0)
    tok = CharTokenizer()
    return (Engine(target, tok, reuse_prefix=True),
            Engine(target, tok, ModelDrafter(draft), 3, sampler=sampler, reuse_prefix=True))


@pytest.mark.parametrize("sampler,verdict", [(rejection_sample, "PASS"), (resample_from_p, "FAIL")])
def test_check_passes_the_real_rule_and_flags_the_bug(sampler, verdict):
    plain, spec = _toy_engines(sampler)
    rep = check_sampling(plain, spec, [[0, 1, 2]], temperature=1.0, positions=2, min_tv=0.1)
    assert rep.verdict == verdict, rep.summary()
    assert all(r.tested for r in rep.results)  # enough rejections for the check to mean something


def test_no_rejections_means_untested():
    target = CycleRunner(vocab=6, period=5, sharp=1.5)
    tok = CharTokenizer()
    plain = Engine(target, tok, reuse_prefix=True)
    spec = Engine(target, tok, ModelDrafter(CycleRunner(vocab=6, period=5, sharp=1.5)), 3, reuse_prefix=True)
    rep = check_sampling(plain, spec, [[0, 1, 2]], temperature=1.0, positions=2, samples=150, min_tv=0.1)
    assert rep.verdict == "UNTESTED" and "tested nothing" in rep.summary()


def test_greedy_check_reports_first_divergence():
    target = CycleRunner()
    tok = CharTokenizer()
    plain = Engine(target, tok)

    class Shifted(CycleRunner):  # a "speculative" engine whose target differs after token 3
        def logits_after(self, t):
            return super().logits_after(0 if t == 3 else t)
    other = Engine(Shifted(), tok)
    rep = check_greedy(plain, other, [[0, 1]], max_tokens=6)
    assert rep.verdict == "FAIL" and rep.divergences[0]["position"] == 2
    assert rep.to_dict() == {"verdict": "FAIL", "prompts": 1, "divergences": rep.divergences}  # verify --json
    assert check_greedy(plain, plain, [[0, 1]], 6).verdict == "PASS"


# --- the known bug's bias, computed in advance (draftwise.bugbias) ---

def _bugged_by_definition(p, q):
    """Output distribution of resample-from-p at one draft position, enumerated from the rule:
    draw x ~ q, accept with min(1, p(x)/q(x)), else draw from p."""
    out = torch.zeros_like(p)
    for x in range(len(p)):
        if q[x] > 0:
            acc = min(1.0, float(p[x] / q[x]))
            out[x] += q[x] * acc
            out += q[x] * (1 - acc) * p
    return out


def test_bug_tv_of_an_ngram_draft_is_p0_times_1_minus_p0():
    p = torch.tensor([0.5, 0.3, 0.2])
    for x, want in ((0, 0.25), (1, 0.3 * 0.7), (2, 0.2 * 0.8)):
        q = torch.zeros(3)
        q[x] = 1.0
        assert bug_tv(p, q) == pytest.approx(want)
        assert torch.allclose(p + bug_shift(p, q), _bugged_by_definition(p, q))


def test_bug_shift_matches_the_rule_and_vanishes_when_the_draft_agrees():
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        p = torch.rand(7, generator=g) ** 3
        q = torch.rand(7, generator=g) ** 3
        p, q = p / p.sum(), q / q.sum()
        b = _bugged_by_definition(p, q)
        assert torch.allclose(p + bug_shift(p, q), b, atol=1e-6)
        assert bug_tv(p, q) == pytest.approx(0.5 * float((b - p).abs().sum()), abs=1e-6)
    assert bug_tv(p, p) == pytest.approx(0.0, abs=1e-7)
    assert bug_tv(p, torch.zeros(7)) == 0.0  # nothing drafted: nothing to get wrong


def test_bug_shift_is_what_the_injected_bug_does():
    # p = (0.5, 0.3, 0.2), n-gram draft of token 0: the bug puts 0.5 + 0.5 * 0.5 = 0.75 on token 0
    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])  # [D+1, V], D = 1
    q = torch.tensor([[1.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    n = 20000
    counts = torch.bincount(torch.tensor([resample_from_p(p, q, torch.tensor([0]), g).tokens[0]
                                          for _ in range(n)]), minlength=3)
    want = p[0] + bug_shift(p[0], q[0])  # (0.75, 0.15, 0.10)
    assert torch.allclose(counts / n, want, atol=0.015)
    counts = torch.bincount(torch.tensor([rejection_sample(p, q, torch.tensor([0]), g).tokens[0]
                                          for _ in range(n)]), minlength=3)
    assert torch.allclose(counts / n, p[0], atol=0.015)  # the real rule: p itself


def test_shift_tv_is_the_marginal_shift():
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    one_hot = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # third first token: nothing drafted
    assert shift_tv(torch.tensor([1.0, 0.0, 0.0]), bug_shift(p, one_hot)) == pytest.approx(0.25)
    assert shift_tv(torch.tensor([0.4, 0.0, 0.6]), bug_shift(p, one_hot)) == pytest.approx(0.4 * 0.25)
    # opposite shifts after two equally likely first tokens cancel in the marginal at position 1
    assert shift_tv(torch.tensor([0.5, 0.5, 0.0]), bug_shift(p, one_hot)) == pytest.approx(0.0, abs=1e-12)


def test_predict_bug_bias_on_the_toy_model():
    target = CycleRunner(vocab=6, period=5, sharp=3.0)
    draft = CycleRunner(vocab=6, period=5, sharp=0.0)  # uniform q
    params = SamplingParams(1.0)
    got = predict_bug_bias(target, ModelDrafter(draft), frozenset(), [0, 1, 2], params)
    # by hand: p after any token puts e^3 / (e^3 + 5) on its successor; x0 ~ p after token 2
    rows = torch.softmax(torch.stack([target.logits_after(t) for t in range(6)]), -1)  # [6, 6]
    w = rows[2]
    want = 0.5 * float((w[:, None] * bug_shift(rows, torch.full((6, 6), 1 / 6))).sum(0).abs().sum())
    assert got.first_tokens == 6 and got.untracked == pytest.approx(0.0, abs=1e-6)
    assert got.tv == pytest.approx(want, rel=1e-5) and 0.05 < got.tv < 0.2
    assert target.seqs == {} and draft.seqs == {}  # released
    # an n-gram drafter finds nothing to propose in [0, 1, 2] + x0 unless x0 repeats a token
    ngram = predict_bug_bias(target, NgramDrafter(2, 3), frozenset(), [0, 1, 2], params)
    assert ngram.tv == 0.0


def test_the_bias_is_predicted_for_the_drafter_a_request_drafts_with():
    """`--drafter ngram` serves an n-gram drafter composed with the prediction member; a request
    without a prediction drafts with the n-gram alone, and the bias predicted is the n-gram's (the
    composed drafter proposes no tokens of its own: the CLI's predictions were 0)."""
    from draftwise.build import with_prediction
    from draftwise.drafters.auto import AutoDrafter

    target = CycleRunner(vocab=6, period=3, sharp=0.0)  # p uniform: the bug's shift p0 (1 - p0) on x
    prompt, params = [0, 1, 2, 0, 1], SamplingParams(1.0)
    alone = predict_bug_bias(target, NgramDrafter(1, 3), frozenset(), prompt, params)
    composed = with_prediction(NgramDrafter(1, 3))
    assert composed.base == "ngram"
    assert predict_bug_bias(target, composed, frozenset(), prompt, params).tv == pytest.approx(alone.tv)
    assert alone.tv > 0.05  # after x0 the n-gram proposes what followed x0 in the prompt
    with pytest.raises(ValueError, match="chooses among"):
        predict_bug_bias(target, AutoDrafter({"ngram": NgramDrafter(1, 3)}), frozenset(), prompt, params)


def test_power_on_a_two_way_split_meets_the_calculation():
    # required_samples is a two-proportion bound; on a bias over two categories the tests reach it.
    # (Over more categories they spread it over more degrees of freedom and have less power:
    # docs/verify.md gives measured rates.)
    rng = np.random.default_rng(0)
    p, b = [0.5, 0.5], [0.75, 0.25]  # TV 0.25: an n-gram draft with p0 = 1/2 under the bug
    n = required_samples(0.25, alpha=0.05, power=0.8)
    hits = [min(homogeneity_test(rng.choice(2, n, p=p).tolist(), rng.choice(2, n, p=b).tolist())[:2]) < 0.05
            for _ in range(400)]
    assert np.mean(hits) >= 0.75  # 0.8 up to the simulation's error
