"""The offline replay of the planner (draftwise.replay) on hand-built teacher-forced traces."""
import pytest

from draftwise.costs import CostCurve
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.draft_length import PRIORS, config_for
from draftwise.planner import Planner
from draftwise.replay import replay, replay_cheap

# llama.cpp-like curves (ms, k = 1..17): a 0.5B draft step costs ~0.45 of a 1.5B target step
VERIFY = [94, 127, 161, 196, 224, 252, 275, 287, 288, 291, 292, 288, 296, 300, 303, 308, 397]
DRAFT = [42, 48, 54, 61, 84, 91, 100, 99, 119, 124, 127, 118, 144, 153, 161, 170, 188]


def trace(agree: list[bool], prompt: int = 40) -> dict:
    """Output tokens 0..n-1; the draft's argmax is the target's token where `agree`, else -1."""
    return {"tokens": list(range(len(agree))), "prompt_tokens": prompt,
            "draft_argmax": [t if a else -1 for t, a in enumerate(agree)],
            "draft_top": [0.9 if a else 0.4 for a in agree], "target_top": [0.95 if a else 0.5 for a in agree]}


def planner(**kw) -> Planner:
    return Planner(CostCurve({1: VERIFY}, (256, 1645.0)), CostCurve({1: DRAFT}, (256, 1029.0)),
                   prior=PRIORS["model"], online=False, **kw)


def plain_s(pl: Planner, tr: dict) -> float:
    return pl.target.raw(tr["prompt_tokens"]) + (len(tr["tokens"]) - 1) * pl.target.raw(1)


def test_fixed_d_replays_acceptance_and_catch_up_by_hand():
    pl = planner()
    tr = trace([True, True, False, True, True, True, True, True])
    secs, c = replay(tr, pl, fixed=2)
    # t=1: positions 1, 2 drafted, 2 rejected (1 accepted, 2 emitted); t=3: 3, 4 accepted (3
    # emitted); t=6: one position of room, accepted (2 emitted) -> t=8, done
    assert (c["rounds"], c["proposed"], c["accepted"], c.get("plain", 0)) == (3, 5, 4, 0)
    d, v = pl.draft.raw, pl.target.raw
    # the first round's draft catches up on the prompt and the first token (41 tokens); later it
    # feeds what it has not seen: the recovered token (1) after one accepted of two, the last
    # draft token and the bonus (2) after two of two (its last proposal is never fed)
    want = v(40) + (d(41) + d(1) + v(3)) + (d(1) + d(1) + v(3)) + (d(2) + v(2))
    assert secs == pytest.approx(want)


def test_auto_drafts_where_the_draft_agrees_and_stays_plain_where_it_never_does():
    pl = planner()
    assert config_for("model", False, pl.max_draft).margin == pl.cfg.margin == 0.03
    code = [trace([True] * 128) for _ in range(3)]
    outs = [replay(tr, pl) for tr in code]
    speed = [plain_s(pl, tr) / s for tr, (s, _) in zip(code, outs)]
    # cold, the model's estimate says it barely beats a plain step, so the first request's plain
    # steps forgo less than its catch-up costs and it never pays it (rent or buy, CatchUp.looks);
    # what the target's confidence showed meanwhile makes the next requests draft long
    assert outs[0][1].get("rounds", 0) == 0 and speed[0] == pytest.approx(1.0)
    assert min(speed[1:]) > 1.3  # long drafts, all accepted
    never = [trace([True] * 3 + [False] * 125) for _ in range(3)]  # confident opener, then nothing
    outs = [replay(tr, pl) for tr in never]
    assert all(plain_s(pl, tr) / s > 0.95 for tr, (s, _) in zip(never, outs))
    assert outs[-1][1].get("rounds", 0) <= 2  # at most a probe once rejections are known


def test_ngram_replay_proposes_from_the_context_by_hand():
    pl = Planner(CostCurve({1: VERIFY}), None, prior=PRIORS["ngram"], online=False)
    tr = {"prompt_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], "prompt_tokens": 11, "tokens": [3, 4, 5, 6, 7, 0, 0, 0]}
    secs, c = replay_cheap(tr, pl, NgramDrafter(), fixed=4)
    # t=1: context ...1 2 3 -> "2 3" occurred before, proposes 4 5 6 7, all accepted, bonus 0 -> t=6;
    # t=6: "7 0" never occurred: plain; t=7: no room left: plain
    assert (c["rounds"], c["proposed"], c["accepted"], c["plain"]) == (1, 4, 4, 2)
    v = pl.target.raw
    assert secs == pytest.approx(v(11) + v(5) + 2 * v(1) + 3 * pl.draft_call_s)
    auto_s, auto_c = replay_cheap(tr, pl, NgramDrafter())
    assert auto_c["accepted"] >= 2 and auto_s < v(11) + 7 * v(1)  # auto drafts (its own D) and gains


def test_oracle_verifies_exactly_the_accepted_tokens_by_hand():
    pl = Planner(CostCurve({1: VERIFY}), None, prior=PRIORS["ngram"][:8], max_draft=8, online=False)
    tr = {"prompt_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], "prompt_tokens": 11, "tokens": [3, 4, 5, 9, 0, 0, 0, 0]}
    secs, c = replay_cheap(tr, pl, NgramDrafter(), oracle=True)
    # t=1: "2 3" -> proposes 4 5 6 7 8 9 (up to room 6); 4 5 accepted, so 2 verified, bonus 9 -> t=4;
    # t=4: "9 0" never occurred: plain steps to the end (t=4..7)
    assert (c["rounds"], c["proposed"], c["accepted"], c["plain"]) == (1, 2, 2, 4)
    v = pl.target.raw
    assert secs == pytest.approx(v(11) + v(3) + 4 * v(1) + 5 * pl.draft_call_s)


def test_suffix_replay_carries_the_global_trie_to_the_next_request():
    pl = Planner(CostCurve({1: VERIFY}), None, prior=PRIORS["suffix"][:8], max_draft=8, online=False)
    tr = {"prompt_ids": [50, 51, 52, 53], "prompt_tokens": 4, "tokens": [60, 61, 62, 63, 64, 65, 66, 67]}
    d = SuffixDrafter()
    _, first = replay_cheap(tr, pl, d, fixed=4, key=0)
    assert first["accepted"] == 0 and d.memory_nodes() > 0  # nothing to copy; released into the trie
    secs, again = replay_cheap(tr, pl, d, fixed=4, key=1)  # asked again: its own output drafted
    # t=1: "... 53 60" found in the trie -> 61 62 63 64 all accepted, bonus 65 -> t=6; then room 1
    assert (again["rounds"], again["proposed"], again["accepted"], again.get("plain", 0)) == (2, 5, 5, 0)
    v = pl.target.raw  # the prefill, a round of 4 + 1 and one of 1 + 1
    assert secs == pytest.approx(v(4) + v(5) + v(2) + 2 * pl.draft_call_s)


def test_tree_replay_follows_the_branch_the_target_takes_by_hand():
    pl = Planner(CostCurve({1: VERIFY}), None, prior=PRIORS["suffix"][:8], max_draft=8, online=False)
    prompt = [9, 0, 1, 2, 5, 8, 0, 1, 2, 3, 7, 0, 1]  # [0 1 2] went on with 5 once and 3 once
    tr = {"prompt_ids": prompt, "prompt_tokens": 13, "tokens": [2, 3, 7, 0, 1, 2]}
    secs, c = replay_cheap(tr, pl, SuffixDrafter(tree=True), fixed=4)
    # t=1: the tree 5 3 | 8 under 5, 7 under 3: the target takes 3 7 (nodes 1, 3), bonus 0 -> t=4;
    # t=4 (room 1): "7 0" -> 1, accepted, bonus 2 -> the end
    assert (c["rounds"], c["proposed"], c["accepted"], c.get("plain", 0)) == (2, 5, 3, 0)
    v = pl.target.raw
    assert secs == pytest.approx(v(13) + v(5) + v(2) + 2 * pl.draft_call_s)
    chain_s, chain = replay_cheap(tr, pl, SuffixDrafter(), fixed=4)
    # the chain follows one continuation, 5 8 0 1, rejected at once (t=2); then "2 3" -> 7 0 1, all
    # accepted, and the bonus ends it: the same tokens in two dearer rounds
    assert (chain["rounds"], chain["proposed"], chain["accepted"]) == (2, 7, 3)
    assert chain_s == pytest.approx(v(13) + v(5) + v(4) + 2 * pl.draft_call_s)
