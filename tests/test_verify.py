"""Acceptance maths: hand-built tensors with exact expected tokens, and distribution tests."""
import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from draftwise.verify import greedy_verify, rejection_sample


def test_greedy_verify_exact_tokens():
    logits = torch.full((4, 5), -1.0)
    for row, best in enumerate([3, 1, 0, 4]):
        logits[row, best] = 2.0
    r = greedy_verify(logits, torch.tensor([3, 1, 2]))  # third draft token != argmax 0
    assert (r.tokens, r.num_accepted, r.bonus) == ([3, 1, 0], 2, False)
    r = greedy_verify(logits, torch.tensor([3, 1, 0]))  # all accepted: bonus = argmax of row 3
    assert (r.tokens, r.num_accepted, r.bonus) == ([3, 1, 0, 4], 3, True)
    r = greedy_verify(logits, torch.tensor([2, 1, 0]))  # first rejected: recovered only
    assert (r.tokens, r.num_accepted) == ([3], 0)


def test_rejection_sample_exact_cases():
    g = torch.Generator().manual_seed(0)
    # p(x) = 0 for the drafted x: always rejected; the residual is one-hot on token 1
    p = torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.3, 0.5]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    for _ in range(20):
        r = rejection_sample(p, q, torch.tensor([0]), g)
        assert (r.tokens, r.num_accepted) == ([1], 0)
    # p == q: always accepted; bonus from a one-hot last row
    p = torch.tensor([[0.3, 0.7, 0.0], [0.6, 0.4, 0.0], [0.0, 0.0, 1.0]])
    for _ in range(20):
        r = rejection_sample(p, p[:2], torch.tensor([1, 0]), g)
        assert (r.tokens, r.num_accepted, r.bonus) == ([1, 0, 2], 2, True)


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="D\\+1"):
        rejection_sample(torch.ones(2, 3) / 3, torch.ones(2, 3) / 3, torch.tensor([0, 1]), None)
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample(torch.ones(3, 3) / 3, torch.ones(2, 4) / 4, torch.tensor([0, 1]), None)
    with pytest.raises(ValueError):
        greedy_verify(torch.ones(3), torch.tensor([0]))


def test_batch_dimension():
    logits = torch.zeros(2, 2, 3)
    logits[0, :, 1] = 1.0
    logits[1, :, 2] = 1.0
    out = greedy_verify(logits, torch.tensor([[1], [1]]))
    assert [r.tokens for r in out] == [[1, 1], [2]]


def _naive_resample(p, q, draft, g):
    """The known bug: at a rejection, resample from p instead of norm(max(0, p - q))."""
    d = len(draft)
    u = torch.rand(d, generator=g, dtype=torch.float64)
    for i in range(d):
        x = int(draft[i])
        if not u[i] < min(1.0, float(p[i, x] / q[i, x])):
            return [*draft[:i].tolist(), int(torch.multinomial(p[i], 1, generator=g))]
    return [*draft.tolist(), int(torch.multinomial(p[d], 1, generator=g))]


def _first_token_freq(fn, p, q, n, seed):
    g = torch.Generator().manual_seed(seed)
    counts = np.zeros(p.shape[1])
    for _ in range(n):
        draft = torch.multinomial(q[0], 1, generator=g)  # [1], drawn from q as a drafter would
        out = fn(p, q, draft, g)
        counts[(out.tokens if hasattr(out, "tokens") else out)[0]] += 1
    return counts / n


def test_two_token_example():
    """p = (0.5, 0.5), q = (0.8, 0.2): P(first = A) must be 0.5; naive resampling gives 0.65."""
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[0.8, 0.2]])
    n = 20000  # standard error 0.0035
    assert _first_token_freq(rejection_sample, p, q, n, 1)[0] == pytest.approx(0.5, abs=0.015)
    assert _first_token_freq(_naive_resample, p, q, n, 1)[0] == pytest.approx(0.65, abs=0.015)


class _Chain:
    """A toy target and drafter: next-token distributions that depend on the previous token."""

    def __init__(self, vocab, seed):
        self.p = torch.distributions.Dirichlet(torch.ones(vocab)).sample((vocab + 1,))  # row = previous token
        self.q = torch.distributions.Dirichlet(torch.ones(vocab)).sample((vocab + 1,))
        self.start = vocab  # row used for the first position

    def two_tokens(self, verify, d, g):
        out, prev = [], self.start
        while len(out) < 2:
            draft, rows = [], [prev]
            for _ in range(d):
                x = int(torch.multinomial(self.q[rows[-1]], 1, generator=g))
                draft.append(x)
                rows.append(x)
            res = verify(self.p[rows], self.q[rows[:-1]], torch.tensor(draft), g)
            toks = res.tokens if hasattr(res, "tokens") else res
            out += toks
            prev = out[-1]
        return out[0], out[1]

    def exact_joint(self):
        first = self.p[self.start]
        joint = (first[:, None] * self.p[: len(first)]).flatten().double()  # P(a, b) = p(a) p(b | a)
        return joint / joint.sum()


def _joint_counts(verify, chain, n, d, seed):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    v = chain.p.shape[1]
    counts = np.zeros(v * v)
    for _ in range(n):
        a, b = chain.two_tokens(verify, d, g)
        counts[a * v + b] += 1
    return counts


@pytest.mark.parametrize("seed", [3, 4])
def test_chi_square_first_and_second_token(seed):
    torch.manual_seed(seed)
    chain = _Chain(vocab=4, seed=seed)
    expected = chain.exact_joint().numpy()
    n = 12000
    good = _joint_counts(rejection_sample, chain, n, d=2, seed=seed)
    assert chisquare(good, expected * n).pvalue > 1e-3
    # the same test has the power to see the naive-resampling bias
    bad = _joint_counts(_naive_resample, chain, n, d=2, seed=seed)
    assert chisquare(bad, expected * n).pvalue < 1e-6


def test_total_variation_shrinks_with_samples():
    chain = _Chain(vocab=4, seed=7)
    expected = chain.exact_joint().numpy()
    tv = []
    for n in (500, 8000):
        c = _joint_counts(rejection_sample, chain, n, d=3, seed=11)
        tv.append(0.5 * np.abs(c / n - expected).sum())
    assert tv[1] < tv[0] and tv[1] < 0.03
