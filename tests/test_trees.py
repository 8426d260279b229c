"""Candidate trees end to end: the suffix drafter's best-first tree, the planner's sizing, the
loop's tree verification with KV compaction (fake and real torch model), and the refusals."""
import numpy as np
import pytest
import torch

from draftwise.costs import CostCurve
from draftwise.drafters.base import Proposal
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine
from draftwise.planner import Planner
from draftwise.sampling import SamplingParams
from fakes import CharTokenizer, CheapDrafter, CycleRunner

G = SamplingParams()
K = 17


def test_best_first_tree_with_scores_and_parents():
    d = SuffixDrafter(depth=6, max_match=3, min_score=0.05, tree=True)
    # after [1 2]: 3 twice, 4 once; after [1 2 3]: 9 both times; after [2 3 9]: 1 once, 8 once
    p = d.propose(1, [1, 2, 3, 9, 1, 2, 4, 1, 2, 3, 9, 8, 1, 2], 4, G, None)
    assert p.tokens == [3, 9, 4, 1] and p.parents == [-1, 0, -1, 1]
    assert p.confidence == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])
    assert p.is_tree and p.first(2).parents == [-1, 0] and not p.first(2).is_tree
    d.min_score = 0.5
    assert d.propose(1, [1, 2, 3, 9, 1, 2, 4, 1, 2, 3, 9, 8, 1, 2], 4, G, None).tokens == [3, 9]
    assert SuffixDrafter(tree=True).name == "suffix-tree"


def test_a_tree_cut_by_the_trie_depth_re_anchors_its_deepest_path():
    d = SuffixDrafter(depth=6, max_match=3, min_score=0.05, tree=True)
    for key, out in ((1, list(range(100, 120))), (2, [100, 101, 102, 50, 51])):  # two earlier outputs
        d.propose(key, [1], 0, G, None)
        d.propose(key, [1] + out, 0, G, None)
        d.release(key)
    p = d.propose(3, [7, 100, 101, 102], 10, G, None)
    # below [100 101 102]: 103 104 105 (cut by the depth) and 50 51; then 106.. re-anchored under 105
    assert p.tokens == [103, 50, 104, 51, 105, 106, 107, 108, 109, 110]
    assert p.parents == [-1, -1, 0, 1, 2, 4, 5, 6, 7, 8]
    assert p.confidence == pytest.approx([0.5] * 10)


def test_a_tree_grows_in_the_trie_whose_walk_goes_furthest():
    """The request's own trie and the global one match equally long; the global one has seen the
    longer continuation (as on a repeated request), so the tree grows there, as a chain would."""
    d = SuffixDrafter(depth=8, max_match=3, tree=True)
    d.propose(1, [1], 0, G, None)
    d.propose(1, [1, 5, 6, 7, 8, 9, 10, 11, 12], 0, G, None)
    d.release(1)
    p = d.propose(2, [5, 6, 7, 50, 5, 6, 7], 5, G, None)  # own trie: 50 5 6 7; global: 8 9 10 11 12
    assert p.tokens == [8, 9, 10, 11, 12]


def _planner(per_token_ms: float) -> Planner:
    c = CostCurve({1: [10.0 + per_token_ms * (k - 1) for k in range(1, K + 1)]})
    return Planner(c, None, prior=0.5, max_draft=16, margin=0.0)


def test_planner_sizes_a_tree_by_its_nodes_chances_and_the_verify_curve():
    pl = _planner(per_token_ms=2.0)  # each node costs 0.2 of a plain step
    req = pl.new_request(100)
    # (1 + 0.9 + 0.5) / 1.4 beats (1 + 0.9) / 1.2 and (1 + 0.9 + 0.5 + 0.1) / 1.6: two nodes
    assert pl.decide(req, available=3, node_p=np.array([0.9, 0.5, 0.1])).d == 2
    assert pl.decide(req, available=3, node_p=np.array([0.15, 0.1, 0.05])).d == 0  # none pays: plain
    pl = _planner(per_token_ms=0.2)  # nearly free nodes: verify them all
    assert pl.decide(pl.new_request(100), available=3, node_p=np.array([0.9, 0.5, 0.1])).d == 3


def test_tree_calibration_learns_each_nodes_chance_from_verified_trees():
    pl = _planner(2.0)
    for _ in range(200):  # nodes scored 0.95 are on the accepted path a fifth of the time
        pl.tree_calib[1].observe_nodes([0.95] * 5, [1.0, 0, 0, 0, 0])
    assert pl.tree_calib[1](0.95) == pytest.approx(0.2, abs=0.03)


def test_a_requests_nodes_follow_its_own_record_against_the_runs_calibration():
    pl = _planner(2.0)
    parents, steps = [-1, 0], [0.5, 0.5]
    fresh = pl.node_chances(pl.new_request(100), parents, steps)
    assert fresh == pytest.approx([0.5, 0.25])  # nothing measured: g(c) = c
    missed, hit = pl.new_request(100), pl.new_request(100)
    pl.observe_nodes(missed, 0, [0.5, 0.5], [0.0, 0.0])  # expected 1 of the two root children: none
    assert missed.tree_fit[0] == pytest.approx([0.0, 1.0])
    pl.observe_nodes(hit, 0, [0.5, 0.5], [1.0, 1.0])  # expected 1 (the run's calibration since): both
    run = pl.node_chances(pl.new_request(100), parents, steps)  # the run's calibration alone
    # (0 + 2) / (1 + 2) of the run's chance for the root's children; deeper steps have no record
    assert pl.node_chances(missed, parents, steps) == pytest.approx(np.array(run) * 2 / 3)
    g = pl.tree_calib[0](0.5)
    assert pl.node_chances(hit, parents, steps)[0] == pytest.approx(min(1.0, g * (2 + 2) / (hit.tree_fit[0, 1] + 2)))
    # the run's calibration learned from both requests' nodes
    assert pl.tree_calib[0].n.sum() == pytest.approx(0.99 * 2.0 + 2.0)


class TreeCounter(CycleRunner):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.tree_forwards = 0

    def forward(self, seq_ids, tokens, num_logits, parents=None):
        self.tree_forwards += bool(parents and any(parents))
        return super().forward(seq_ids, tokens, num_logits, parents)


# [0 1 2] went on with 5 once and 3 once: the tree verifies both, the target (t + 1) picks 3
PROMPT = [9, 0, 1, 2, 5, 8, 0, 1, 2, 3, 7, 0, 1]


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, seed=3)])
@pytest.mark.parametrize("d", [6, "auto"])
def test_tree_decoding_is_plain_decoding(params, d, monkeypatch):
    if d == "auto":  # the planner's curve, without profiling the fake runner
        import draftwise.policy_build as policy_build
        monkeypatch.setattr(policy_build, "make_planner", lambda runner, drafter, **kw: _planner(1.0))
    runner = TreeCounter(period=7)
    kw = dict(max_tokens=40, temperature=params.temperature, seed=params.seed)
    plain = Engine(runner, CharTokenizer()).generate(PROMPT, **kw)
    from draftwise.policy_build import make_policy
    drafter = SuffixDrafter(tree=True)
    eng = Engine(runner, CharTokenizer(), drafter, d, policy=make_policy(d, runner, drafter))
    spec = eng.generate(PROMPT, **kw)
    assert spec.token_ids == plain.token_ids
    assert runner.tree_forwards > 0 and spec.stats.accepted_draft_tokens > 0 and runner.seqs == {}


def test_a_backend_without_trees_is_refused_by_name():
    runner = CycleRunner()
    runner.trees = False
    runner.backend = "llama.cpp"
    with pytest.raises(ValueError, match="suffix-tree proposes candidate trees; the llama.cpp backend"):
        Engine(runner, CharTokenizer(), SuffixDrafter(tree=True), 4)


def test_proposal_head_of_a_tree_is_a_tree():
    p = Proposal([1, 2, 3], confidence=[0.9, 0.5, 0.4], parents=[-1, -1, 0])
    assert p.first(2).parents == [-1, -1] and p.first(2).is_tree
    assert not Proposal([1, 2], parents=[-1, 0]).is_tree


@pytest.fixture(scope="module")
def smol():
    from draftwise.models.load import load_torch
    return load_torch("smollm2-135m", threads=2)


def test_torch_tree_forward_equals_each_paths_chain_and_keep_compacts(smol):
    runner, tok = smol
    prompt = tok.encode("def add(a, b):\n    return")
    tree, chain = runner.new_sequence(), runner.new_sequence()
    for s in (tree, chain):
        runner.forward([s], [prompt[:-1]], [0])
    n = runner.length(tree)
    # new tokens: last, A (0), B (0), C (1), D (2): the path last -> B -> D as a chain
    rows = runner.forward([tree], [[prompt[-1], 264, 287, 300, 301]], [5], [[-1, 0, 0, 1, 2]])[0]
    want = runner.forward([chain], [[prompt[-1], 287, 301]], [3])[0]
    torch.testing.assert_close(rows[[0, 2, 4]], want, atol=1e-3, rtol=0)
    runner.keep(tree, n + 1, [n + 2, n + 4])
    assert runner.length(tree) == runner.length(chain) == n + 3
    a, b = (runner.forward([s], [[55]], [1])[0] for s in (tree, chain))
    torch.testing.assert_close(a, b, atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="cannot keep"):
        runner.keep(tree, n, [n + 10])
    for s in (tree, chain):
        runner.free(s)


def test_torch_greedy_tree_decoding_equals_plain(smol):
    from draftwise.compare import divergence_report
    from draftwise.prompts import edit_eval
    runner, tok = smol
    ids = edit_eval(1)[0].token_ids(tok)
    plain = Engine(runner, tok).generate(ids, max_tokens=48)
    spec = Engine(runner, tok, SuffixDrafter(tree=True), 8).generate(ids, max_tokens=48)
    assert divergence_report(runner, ids, plain.token_ids, spec.token_ids) is None
    assert spec.stats.accepted_draft_tokens > 0


def test_a_nodes_step_and_what_a_tree_round_teaches():
    from draftwise.planner import Decision, RoundRecord
    from draftwise.policy import tree_steps
    p = Proposal([3, 9, 4, 1], confidence=[2 / 3, 2 / 3, 1 / 3, 1 / 6], parents=[-1, 0, -1, 1])
    assert tree_steps(p) == pytest.approx([2 / 3, 1.0, 1 / 3, 0.25])
    pl = _planner(2.0)
    req = pl.new_request(100)
    first, deep = pl.tree_calib
    # path [2]: node 0 rejected, so its child 1 (and 1's child 3) were never reached: not observed
    pl.learn(req, Decision(4, 1.0, 1.0), RoundRecord(4, 1, 2, tree_steps(p), path=[2], parents=p.parents))
    assert first.n.sum() == pytest.approx(2.0) and deep.n.sum() == 0  # nodes 0 and 2, the root's children
    assert first.acc[first._bin_of(1 / 3)] == pytest.approx(1.0) and first.acc.sum() == pytest.approx(1.0)
    pl.learn(req, Decision(4, 1.0, 1.0), RoundRecord(4, 2, 3, tree_steps(p), path=[0, 1], parents=p.parents))
    assert deep.n.sum() == pytest.approx(2.0) and deep.acc.sum() == pytest.approx(1.0)  # node 1 yes, node 3 no


class SiblingsDrafter(CheapDrafter):
    """Proposes the next token and a wrong sibling of it, both children of the context's end."""
    name, tree = "siblings", True

    def propose(self, seq_key, context, num_tokens, params, generator, stop=None):
        nxt = (context[-1] + 1) % 7
        return Proposal([nxt, (nxt + 3) % 7][:num_tokens], confidence=[0.6, 0.4][:num_tokens],
                        parents=[-1, -1][:num_tokens])



def test_a_path_ending_at_a_leaf_is_a_bonus_not_a_rejection():
    """Both nodes are the root's children: the right one is accepted and is a leaf, so the round
    emits it and a bonus; 1 of 2 nodes accepted, yet nothing was rejected (draftwise verify counts
    rejections per position from this)."""
    runner = TreeCounter(period=7)
    spec = Engine(runner, CharTokenizer(), SiblingsDrafter(), 2).generate(PROMPT, max_tokens=9)
    assert spec.token_ids == Engine(runner, CharTokenizer()).generate(PROMPT, max_tokens=9).token_ids
    assert all(r.accepted == 1 and not r.rejected for r in spec.rounds)  # the last round has room for 1 node
    assert [r.proposed for r in spec.rounds] == [2, 2, 2, 1]
    assert spec.stats.emitted_tokens == 1 + 2 * len(spec.rounds)
