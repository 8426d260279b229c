"""Tree verification: hand-built trees with exact expected tokens, and the output distribution."""
import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from draftwise.bugbias import sibling_shift
from draftwise.losscheck import resample_from_p_tree
from draftwise.verify import check_tree, greedy_verify_tree, rejection_sample_tree

# root -> 3 (node 0) -> 1 (node 2)
#      -> 2 (node 1) -> 0 (node 3) -> 4 (node 4)
TOKENS, PARENTS = [3, 2, 1, 0, 4], [-1, -1, 0, 1, 3]


def _logits(best: list[int], v: int = 5) -> torch.Tensor:
    x = torch.full((len(best), v), -1.0)
    x[torch.arange(len(best)), torch.tensor(best)] = 2.0
    return x


def test_greedy_tree_follows_the_argmax_branch():
    # rows: root, node0..node4; the root's argmax 2 picks the second branch, then 0, then 4
    r = greedy_verify_tree(_logits([2, 1, 0, 3, 4, 1]), TOKENS, PARENTS)
    assert (r.tokens, r.num_accepted, r.num_proposed, r.path) == ([2, 0, 4, 1], 3, 5, [1, 3, 4])
    assert r.bonus
    # the first branch: 3, then node 0's argmax 1 is node 2, whose argmax 0 has no child: recovered
    r = greedy_verify_tree(_logits([3, 1, 0, 0, 0, 0]), TOKENS, PARENTS)
    assert (r.tokens, r.path) == ([3, 1, 0], [0, 2])
    # no child matches the root's argmax: one token, as a plain step
    r = greedy_verify_tree(_logits([4, 0, 0, 0, 0, 0]), TOKENS, PARENTS)
    assert (r.tokens, r.num_accepted, r.path) == ([4], 0, [])


def test_tree_shape_is_checked():
    with pytest.raises(ValueError, match="parent"):
        check_tree([1, 2], [-1, 1])
    with pytest.raises(ValueError, match="repeats token 1"):
        check_tree([1, 1], [-1, -1])
    with pytest.raises(ValueError, match="one parent per token"):
        check_tree([1, 2], [-1])


def test_one_hot_siblings_exact_cases():
    g = torch.Generator().manual_seed(0)
    # p(3) = 0 at the root: node 0 is always rejected; p(2) = 1 once 3 is removed: node 1 always
    # accepted; its child 0 has p = 1 there; node 4 after it has p = 0: the residual is token 1
    p = torch.zeros(6, 5)
    p[0, 2] = 1.0
    p[2, 0] = 1.0
    p[4, 1] = 1.0
    p[[1, 3, 5], 0] = 1.0
    q = torch.zeros(5, 5)
    q[torch.arange(5), torch.tensor(TOKENS)] = 1.0
    for _ in range(20):
        r = rejection_sample_tree(p, q, TOKENS, PARENTS, g)
        assert (r.tokens, r.path) == ([2, 0, 1], [1, 3])


def _emit_law(p: torch.Tensor, q: torch.Tensor, tokens, parents, n: int, seed: int, drawn=()) -> dict:
    """Counts of the first two emitted tokens; the nodes in `drawn` get a token drawn from their q
    each time (as a sampling drafter makes them), the others keep theirs (q one-hot there)."""
    g, gd = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1000)
    counts: dict = {}
    for _ in range(n):
        tokens = list(tokens)
        for i in drawn:
            tokens[i] = int(torch.multinomial(q[i], 1, generator=gd))
        r = rejection_sample_tree(p, q, tokens, parents, g)
        key = tuple(r.tokens[:2])
        counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.parametrize("seed", [0, 1])
def test_tree_keeps_the_target_distribution(seed):
    """First two emitted tokens against the target's law. V = 3; the root has children 0 and 1
    (one-hot, as a suffix tree drafts), node 0 has a child drawn from a soft q each time. The target's next
    distribution depends on the first token: row of node 0 after 0, row of node 1 after 1, and
    after 2 (no node) the test's own row 'after2', which is what a plain step would then use."""
    rng = np.random.default_rng(seed)
    v = 3
    tokens, parents = [0, 1, 2], [-1, -1, 0]
    p = torch.tensor(rng.dirichlet(np.ones(v), size=4), dtype=torch.float32)  # rows: root, n0, n1, n2
    q = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], list(rng.dirichlet(np.ones(v)))], dtype=torch.float32)
    n = 20000
    counts = _emit_law(p, q, tokens, parents, n, seed, drawn=[2])
    # the only second-token rows the test can check: after 0 (node 0's row) and after 1 (node 1's)
    expect, seen = [], []
    for a, b in itertools.product(range(2), range(v)):
        expect.append(float(p[0, a] * p[1 + a, b]))
        seen.append(counts.get((a, b), 0))
    first2 = sum(c for k, c in counts.items() if k[0] == 2)
    expect.append(float(p[0, 2]))
    seen.append(first2)
    expect = np.array(expect) * n / sum(expect)
    _, pval = chisquare(seen, expect)
    assert pval > 1e-3, (seen, expect)


def test_a_wrong_rule_is_caught():
    """The same test fails for the rule `draftwise verify --inject-bug` puts on trees: resample from
    p, not the residual, once every child is rejected (emits 0.6, 0.36, 0.04 here, not p)."""
    p = torch.tensor([[0.5, 0.3, 0.2]] * 3)
    tokens, parents = [0, 1], [-1, -1]
    q = torch.zeros(2, 3)
    q[0, 0] = q[1, 1] = 1.0
    g = torch.Generator().manual_seed(0)
    n = 20000
    counts = np.bincount([resample_from_p_tree(p, q, tokens, parents, g).tokens[0] for _ in range(n)], minlength=3)
    _, pval = chisquare(counts, p[0].numpy() * n)
    assert pval < 1e-6
    bugged = p[0].double() + sibling_shift(p[0].double(), q.double())  # what verify predicts the bug does
    assert torch.allclose(bugged, torch.tensor([0.6, 0.36, 0.04], dtype=torch.float64))
    assert 0.5 * float((bugged - p[0]).abs().sum()) == pytest.approx(0.8 * 0.2)  # p(S) (1 - p(S))
    _, pval = chisquare(counts, bugged.numpy() / bugged.sum().item() * n)
    assert pval > 1e-3
    q = torch.zeros(2, 3)
    q[0, 0] = q[1, 1] = 1.0
    right = _emit_law(p, q, tokens, parents, n, 0)
    seen = [sum(c for k, c in right.items() if k[0] == t) for t in range(3)]
    _, pval = chisquare(seen, p[0].numpy() * n)
    assert pval > 1e-3
