"""`--drafter auto`: the composite drafter, the per-round choice among its members, greedy identity,
and a private request through the engine."""
import pytest

from draftwise.costs import CostCurve
from draftwise.drafters.auto import AutoDrafter
from draftwise.drafters.base import Proposal
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.drafters.suffix import SuffixDrafter
from draftwise.engine import Engine
from draftwise.catch_up import CatchUp
from draftwise.planner import Planner
from draftwise.choice import DrafterChoice
from draftwise.sampling import SamplingParams
from fakes import CharTokenizer, CheapDrafter, CycleRunner

PROMPT = [0, 1, 2, 3, 4, 0, 1]  # CycleRunner continues t -> (t + 1) % 5


class Fixed(CheapDrafter):
    """A cheap drafter that always proposes `tokens` (cut to the number asked)."""

    def __init__(self, name, tokens):
        self.name, self.tokens, self.calls = name, tokens, 0

    def propose(self, key, ctx, n, params, gen, stop=None):
        self.calls += 1
        return Proposal(self.tokens[:n])

    def memory_nodes(self):
        return 7


class Cycle(Fixed):
    """Proposes the target's own continuation: always accepted."""

    def propose(self, key, ctx, n, params, gen, stop=None):
        self.calls += 1
        return Proposal([(ctx[-1] + 1 + i) % 5 for i in range(n)])


def choice(names, per_token_ms=0.5, **kw):
    curve = CostCurve({1: [10.0 + per_token_ms * k for k in range(17)]})
    return DrafterChoice({n: Planner(curve, None, prior=0.6, max_draft=8, online=False, **kw) for n in names})


def test_auto_drafter_proposes_from_every_cheap_member_and_leaves_a_model_for_later():
    model = ModelDrafter(CycleRunner())
    d = AutoDrafter({"a": Fixed("a", [1, 2, 3]), "b": Fixed("b", [4]), "model": model})
    p = d.propose(0, [0], 2, SamplingParams(), None)
    assert p.tokens == [] and {n: q.tokens for n, q in p.options.items()} == {"a": [1, 2], "b": [4]}
    assert d.memory_nodes() == 14 and d.modelled == {"model": model} and d.runners == (model.runner,)
    assert model.runner.forwards == []  # a member with a model drafts only when chosen (draft_many)
    assert d.draft_many("model", [(0, [0, 1], 3, SamplingParams(), None)])[0].tokens == [2, 3, 4]
    with pytest.raises(ValueError, match="at least one"):
        AutoDrafter({})


def test_choice_verifies_the_member_that_is_right_and_output_equals_plain():
    plain = Engine(CycleRunner(), CharTokenizer()).generate(PROMPT, max_tokens=40)
    right, wrong = Cycle("right", []), Fixed("wrong", [9, 9, 9, 9, 9, 9, 9, 9])
    drafter = AutoDrafter({"wrong": wrong, "right": right})
    r = Engine(CycleRunner(), CharTokenizer(), drafter, "auto", policy=choice(["wrong", "right"])).generate(
        PROMPT, max_tokens=40)
    assert r.token_ids == plain.token_ids
    chosen = [p.drafter for p in r.decisions]
    assert chosen.count("right") >= len(chosen) - 2  # the wrong one may be tried once at most
    assert r.stats.accepted_draft_tokens >= 30 and wrong.calls == right.calls  # both proposed every round


def test_choice_takes_plain_steps_when_no_member_is_right_but_keeps_scoring_them():
    a, b = Fixed("a", [9] * 8), Fixed("b", [8] * 8)
    pol = choice(["a", "b"], per_token_ms=3.0)
    r = Engine(CycleRunner(), CharTokenizer(), AutoDrafter({"a": a, "b": b}), "auto", policy=pol).generate(
        PROMPT, max_tokens=30)
    chosen = [p.drafter for p in r.decisions]
    assert chosen[-10:] == ["none"] * 10  # both learnt wrong from their shadows
    assert pol.planners["a"].workload.alpha()[0] < 0.2 and pol.planners["b"].workload.alpha()[0] < 0.2


def test_a_member_not_chosen_learns_its_deep_positions_from_the_greedy_tokens():
    """b is right at its first token and wrong at its second; a, always right, is chosen: b's
    estimate at position 2 falls, measured on a's rounds (a first-token shadow would say nothing)."""
    class FirstOnly(Fixed):
        def propose(self, key, ctx, n, params, gen, stop=None):
            return Proposal([(ctx[-1] + 1) % 5] + [9] * (n - 1))

    pol = choice(["a", "b"])
    r = Engine(CycleRunner(), CharTokenizer(), AutoDrafter({"a": Cycle("a", []), "b": FirstOnly("b", [])}),
               "auto", policy=pol).generate(PROMPT, max_tokens=40)
    assert [p.drafter for p in r.decisions].count("a") >= len(r.decisions) - 2
    alpha = pol.planners["b"].workload.alpha()
    assert alpha[0] > 0.8 and alpha[1] < 0.2


def test_choice_follows_the_member_that_becomes_right():
    """A request where member b is right only in the second half: the choice moves to it."""
    class Half(Fixed):
        def propose(self, key, ctx, n, params, gen, stop=None):
            return Proposal([(ctx[-1] + 1 + i) % 5 for i in range(n)] if len(ctx) > 30 else [7] * n)

    a, b = Cycle("a", []), Half("b", [])
    a_late = Fixed("a", [9] * 8)

    class Switch(Fixed):  # right early, wrong late
        def propose(self, key, ctx, n, params, gen, stop=None):
            return (a if len(ctx) <= 30 else a_late).propose(key, ctx, n, params, gen)

    r = Engine(CycleRunner(), CharTokenizer(), AutoDrafter({"a": Switch("a", []), "b": b}), "auto",
               policy=choice(["a", "b"])).generate(PROMPT, max_tokens=60)
    chosen = [p.drafter for p in r.decisions]
    assert "a" in chosen[:3] and chosen[-3:] == ["b"] * 3


def choice_with_model(cheap, model, step_ms, prior=0.6):
    """DrafterChoice over cheap members and a draft model ("model") whose one-token forward
    costs step_ms next to the target's 10 ms (a forward of k tokens 1 + 0.05 k times that)."""
    curve = CostCurve({1: [10.0 + 0.5 * k for k in range(17)]})
    draft = CostCurve({1: [step_ms * (1 + 0.05 * k) for k in range(17)]})
    planners = {n: Planner(curve, None, prior=0.6, max_draft=8, online=False) for n in cheap}
    planners["model"] = Planner(curve, draft, prior=prior, max_draft=8, online=False)
    return DrafterChoice(planners, {"model": model})


def test_choice_drafts_with_a_model_only_when_chosen_and_output_equals_plain():
    plain = Engine(CycleRunner(), CharTokenizer()).generate(PROMPT, max_tokens=40)
    wrong, model = Fixed("wrong", [9] * 8), ModelDrafter(CycleRunner())  # the model continues as the target
    drafter = AutoDrafter({"wrong": wrong, "model": model})
    r = Engine(CycleRunner(), CharTokenizer(), drafter, "auto", policy=choice_with_model(["wrong"], model, 1.0)).generate(
        PROMPT, max_tokens=40)
    assert r.token_ids == plain.token_ids
    chosen = [p.drafter for p in r.decisions]
    assert chosen.count("model") >= len(chosen) - 2 and r.stats.accepted_draft_tokens >= 30
    assert wrong.calls == len(r.decisions)  # the cheap member proposed every round, the model drafted when chosen
    drafted = sum(p.proposed for p in r.decisions if p.drafter == "model")
    assert sum(p.proposed for p in r.decisions) == r.stats.proposed_tokens and drafted >= 30
    assert 0 < len(model.runner.forwards) <= drafted + len(chosen)  # a forward per drafted token, at most


def test_a_model_that_sat_out_catches_up_when_the_choice_moves_to_it():
    """A free cheap member is right for the first half; the draft model (a step 2 ms, believed
    right 9 times in 10) is right throughout. Where the free member is right it is chosen, and
    the model, when chosen again, first catches up on everything it did not see (the plan prices
    that as `unseen`); once the free member is wrong (and the request's rate without the model has
    fallen below what the model promises, catch-up included) the model is chosen (but for the
    last few tokens, where a short round of the free member may promise more)."""
    a, a_late = Cycle("a", []), Fixed("a", [9] * 8)

    class Switch(Fixed):  # right early, wrong late
        def propose(self, key, ctx, n, params, gen, stop=None):
            return (a if len(ctx) <= 30 else a_late).propose(key, ctx, n, params, gen)

    model = ModelDrafter(CycleRunner())
    plain = Engine(CycleRunner(), CharTokenizer()).generate(PROMPT, max_tokens=60)
    r = Engine(CycleRunner(), CharTokenizer(), AutoDrafter({"a": Switch("a", []), "model": model}), "auto",
               policy=choice_with_model(["a"], model, 2.0, prior=0.9)).generate(PROMPT, max_tokens=60)
    assert r.token_ids == plain.token_ids
    chosen = [p.drafter for p in r.decisions]
    back = [i for i in range(1, len(chosen)) if chosen[i] == "model" and chosen[i - 1] == "a"]
    assert back  # the choice moved back to the model after rounds of the free member
    assert chosen[back[-1]:back[-1] + 3] == ["model"] * 3  # and stays on it (the last tokens aside)
    # drafting round after round it catches up on its last round's bonus token and one more; after
    # sitting out, on every token emitted meanwhile
    assert all(r.decisions[i].unseen > 2 for i in back)
    assert all(r.decisions[i].unseen <= 2 for i in range(1, len(chosen)) if chosen[i] == chosen[i - 1] == "model")


def test_a_model_believed_wrong_is_chosen_on_the_targets_confidence_while_it_sits_out():
    """A draft model whose prior says it is rarely right (0.1 a position) next to a cheap member
    that is always wrong (soon learnt: its rounds stop). The target is confident at each
    (top probability ~0.99 on CycleRunner), which the model's planner reads as a shadow of its
    acceptance while it sits out (as `model:auto` does at a plain step), so it is chosen and,
    being right, drafts the rest."""
    wrong, model = Fixed("wrong", [9] * 8), ModelDrafter(CycleRunner())
    plain = Engine(CycleRunner(), CharTokenizer()).generate(PROMPT, max_tokens=60)
    r = Engine(CycleRunner(), CharTokenizer(), AutoDrafter({"wrong": wrong, "model": model}), "auto",
               policy=choice_with_model(["wrong"], model, 1.0, prior=0.1)).generate(PROMPT, max_tokens=60)
    assert r.token_ids == plain.token_ids
    chosen = [p.drafter for p in r.decisions]
    assert "model" in chosen[:10] and chosen[-3:] == ["model"] * 3
    assert r.stats.accepted_draft_tokens >= 40


def test_a_models_catch_up_must_beat_the_rate_the_request_goes_at_not_a_plain_step():
    """A 200-token prompt; a cheap member right every time but proposing 2 tokens (3 tokens per
    11 ms round: 3.7 ms a token), and a draft model believed right 9 times in 10 that drafts for
    0.5 ms a token and catches up at 0.5 ms a token too: ~100 ms for the prompt. Per round the model
    promises more (6.1 tokens per 18 ms at D = 8: 3.0 ms a token), and against plain decoding
    (10 ms a token) its catch-up repays over the request's 60 tokens (~420 ms saved); against the
    3.7 ms a token the request has measured with the cheap member it does not (~40 ms), so the
    model is never chosen (here after three looks; with CatchUp.looks as it is, the cheap member's
    rounds forgo ~2 ms each, so the request never stops looking)."""
    prompt = [i % 5 for i in range(200)]
    curve = CostCurve({1: [10.0 + 0.5 * k for k in range(17)]})
    draft = CostCurve({1: [0.5 * k for k in range(1, 18)]})  # k tokens: 0.5 k ms (linear past 17)

    def run(base_rate_seen: bool, looks: bool = False):
        model = ModelDrafter(CycleRunner())
        planners = {"two": Planner(curve, None, prior=0.9, max_draft=8, online=False),
                    "model": Planner(curve, draft, prior=0.9, max_draft=8, online=False)}
        pol = DrafterChoice(planners, {"model": model})
        if not base_rate_seen:  # the rule before: a catch-up counted against a plain step
            decide = planners["model"].decide
            planners["model"].decide = lambda *a, base_rate=None, **k: decide(*a, **k)
        with pytest.MonkeyPatch.context() as mp:
            if not looks:  # three looks at most, then the catch-up's own rule decides
                mp.setattr(CatchUp, "looks", staticmethod(lambda req, *a: len(req.drafts) < 3))
            return Engine(CycleRunner(), CharTokenizer(), AutoDrafter({"two": Two("two", []), "model": model}),
                          "auto", policy=pol).generate(prompt, max_tokens=60)

    class Two(Cycle):
        def propose(self, key, ctx, n, params, gen, stop=None):
            return Proposal([(ctx[-1] + 1 + i) % 5 for i in range(min(n, 2))])

    plain = Engine(CycleRunner(), CharTokenizer()).generate(prompt, max_tokens=60)
    r = run(True)
    assert r.token_ids == plain.token_ids
    assert {p.drafter for p in r.decisions} == {"two"}
    assert "model" in {p.drafter for p in run(False).decisions}  # against a plain step it would switch
    assert {p.drafter for p in run(False, looks=True).decisions} == {"two"}  # it looks throughout


def test_a_models_prompt_catch_up_waits_until_the_saving_forgone_reaches_its_cost(monkeypatch):
    """Rent or buy (CatchUp.looks): a 200-token prompt the draft model catches up on at 0.5 ms a
    token (~100 ms, ten plain steps), next to a cheap member that is always wrong (a round of
    ~11 ms that emits one token). The model, believed right 9 times in 10 (~3 ms a token), is not
    chosen while the seconds it would have saved on the cheap member's rounds so far (each
    round's planned seconds less one token at the model's rate), one more plain step's included,
    fit in its catch-up; then it is, and drafts to the end."""
    prompt = [i % 5 for i in range(200)]
    curve = CostCurve({1: [10.0 + 0.5 * k for k in range(17)]})
    draft = CostCurve({1: [0.5 * k for k in range(1, 18)]})  # k tokens: 0.5 k ms (linear past 17)
    looked = []

    looks = CatchUp.looks

    def looking(req, catch_up, r_plain):
        out = looks(req, catch_up, r_plain)
        looked.append((req.forgone_s, 1 / r_plain - 1 / req.model_rate, catch_up, out))
        return out
    monkeypatch.setattr(CatchUp, "looks", staticmethod(looking))
    model = ModelDrafter(CycleRunner())
    planners = {"wrong": Planner(curve, None, prior=0.6, max_draft=8, online=False),
                "model": Planner(curve, draft, prior=0.9, max_draft=8, online=False)}
    r = Engine(CycleRunner(), CharTokenizer(), AutoDrafter({"wrong": Fixed("wrong", [9] * 8), "model": model}),
               "auto", policy=DrafterChoice(planners, {"model": model})).generate(prompt, max_tokens=60)
    assert r.token_ids == Engine(CycleRunner(), CharTokenizer()).generate(prompt, max_tokens=60).token_ids
    chosen = [p.drafter for p in r.decisions]
    i = chosen.index("model")
    assert set(chosen[:i]) <= {"wrong", "none"} and set(chosen[i:-1]) == {"model"}
    assert [looks for *_, looks in looked] == [True] * i + [False]  # looked, then bought
    for forgone, step, catch_up, looks in looked:
        assert 0.005 < step < 0.008  # s: a 10 ms step less the model's ~3 ms a token
    assert looked[-2][0] + looked[-2][1] <= looked[-2][2] < looked[-1][0] + looked[-1][1]  # the last look, the buy
    for (before, *_), (after, *_), p in zip(looked, looked[1:], r.decisions):  # one token a round
        assert after - before == pytest.approx(p.predicted_ms / 1e3 - (10e-3 - looked[0][1]), abs=1e-3)
    assert 100e-3 < looked[-1][2] < 110e-3 and i >= 10 and r.decisions[i].unseen >= 200


def test_fixed_d_with_auto_drafter_takes_the_longest_proposal():
    short, long = Fixed("a", [1]), Cycle("b", [])
    r = Engine(CycleRunner(), CharTokenizer(), AutoDrafter({"a": short, "b": long}), 3).generate(PROMPT, max_tokens=20)
    assert {p for _, p, *_ in r.rounds[:-1]} == {3} and r.stats.accepted_draft_tokens >= 12


def test_sampling_through_auto_is_seeded_and_within_the_vocabulary():
    def run(seed):  # a fresh engine: the global trie and the planners' workload start empty each time
        drafter = AutoDrafter({"ngram": NgramDrafter(1, 3), "suffix": SuffixDrafter()})
        eng = Engine(CycleRunner(sharp=2.0), CharTokenizer(), drafter, "auto", policy=choice(["ngram", "suffix"]))
        return eng.generate(PROMPT, max_tokens=30, temperature=0.8, seed=seed)
    a, b, c = run(3), run(3), run(4)
    # seeded: the same seed, the same tokens; sampled, not greedy: at T 0.8 the cycle's next token
    # has p ~0.45 (sharp 2), so another seed takes another path
    assert a.token_ids == b.token_ids != c.token_ids and a.stats.verification_rounds > 0
    assert set(a.token_ids) <= set(range(16)) and 0 < len(a.token_ids) <= 30


def test_a_private_request_neither_feeds_nor_reads_the_global_trie():
    sfx = SuffixDrafter()
    eng = Engine(CycleRunner(), CharTokenizer(), sfx, 6)
    empty = sfx.memory_nodes()  # the root
    eng.generate([0, 1], max_tokens=20, private=True)
    assert sfx.memory_nodes() == empty
    eng.generate([0, 1], max_tokens=20)
    grown = sfx.memory_nodes()
    assert grown > empty
    # a private request with a fresh prompt gets nothing from the global trie on its first round
    r = eng.generate([2], max_tokens=4, private=True)
    assert r.stats.proposed_tokens == 0 and sfx.memory_nodes() == grown and r.token_ids == [3, 4, 0, 1]
    assert eng.generate([2], max_tokens=4).stats.proposed_tokens > 0  # shared: it reads the trie
