import numpy as np
import pytest

from draftwise.drafters.ngram import NgramDrafter, ngram_propose


def a(*x):
    return np.array(x, dtype=np.int64)


def test_docstring_example():
    assert ngram_propose(a(1, 2, 3, 4, 1, 2), 1, 3, 2).tolist() == [3, 4]


def test_longest_match_wins_over_recent_shorter():
    # suffix [7 8 9]: the 3-gram occurred at 0 (followed by 1); the 1-gram [9] more recently (followed by 5)
    toks = a(7, 8, 9, 1, 9, 5, 7, 8, 9)
    assert ngram_propose(toks, 1, 3, 1).tolist() == [1]
    assert ngram_propose(toks, 1, 1, 1).tolist() == [5]  # only 1-grams: the most recent occurrence


def test_no_match_and_limits():
    assert ngram_propose(a(1, 2, 3), 1, 3, 4).tolist() == []
    assert ngram_propose(a(1, 2, 1, 2), 3, 3, 4).tolist() == []  # [2 1 2] never occurred before
    assert ngram_propose(a(5, 6, 5), 1, 2, 10).tolist() == [6, 5]  # continuation runs to the end
    assert ngram_propose(a(5, 6, 5), 1, 2, 0).tolist() == []


def test_drafter_proposal_is_one_hot():
    prop = NgramDrafter(1, 3).propose(0, [1, 2, 3, 4, 1, 2], 2, None, None)
    assert prop.tokens == [3, 4]
    q = prop.draft_probs(6)
    assert q.shape == (2, 6) and q[0, 3] == 1 and q[1, 4] == 1 and q.sum() == 2


def test_invalid_sizes():
    with pytest.raises(ValueError, match="min_n"):
        NgramDrafter(3, 2)
