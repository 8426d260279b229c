"""The lossless check's statistics, and the check itself on a toy model with a real and a wrong sampler."""
import random

import pytest

from draftwise.drafters.model import ModelDrafter
from draftwise.engine import Engine
from draftwise.losscheck import (check_greedy, check_sampling, homogeneity_test, required_samples,
                                 resample_from_p)
from draftwise.verify import rejection_sample
from fakes import CharTokenizer, CycleRunner


def test_required_samples_formula():
    # (z_{0.975} + z_{0.8})^2 / (2 * 0.1^2) = (1.95996 + 0.84162)^2 / 0.02 = 392.4
    assert required_samples(0.1) == 393
    assert required_samples(0.1, n_tests=4) > 393  # Bonferroni asks for more
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
    assert check_greedy(plain, plain, [[0, 1]], 6).verdict == "PASS"
