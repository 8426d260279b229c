"""The grammar constraint (draftwise.grammar) and the acceptance rule on masked distributions
(draftwise.constrained, draftwise.verifier): hand-built rows with exact expected tokens."""

import pytest
import torch

pytest.importorskip("llguidance")

from draftwise.constrained import constrain  # noqa: E402
from draftwise.drafters.base import Proposal  # noqa: E402
from draftwise.grammar import Grammars  # noqa: E402
from draftwise.sampling import SamplingParams  # noqa: E402
from draftwise.verifier import Verifier  # noqa: E402
from grammar_fakes import EOS, PIECES, JsonTokenizer  # noqa: E402

SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}
TOK = JsonTokenizer()


@pytest.fixture(scope="module")
def grammars():
    return Grammars(TOK, len(PIECES))


def ids(text):
    return TOK.encode(text)


def test_the_mask_follows_the_text(grammars):
    c = grammars.json_schema(SCHEMA).start()
    assert c.allowed().nonzero().flatten().tolist() == [PIECES.index('{"')]  # keys and layout are fixed
    c.advance(ids('{"a": "ab", "b": '))
    allowed = {PIECES[t] for t in c.allowed().nonzero().flatten().tolist()}
    assert allowed == {"true", "false"}
    c.advance(ids("true}"))
    assert c.finished and c.allowed().nonzero().flatten().tolist() == [EOS]


def test_forced_tokens_are_the_run_the_grammar_fixes(grammars):
    c = grammars.json_schema(SCHEMA).start()
    assert [PIECES[t] for t in c.forced(8)] == ['{"', "a", '": ']
    assert [PIECES[t] for t in c.forced(2)] == ['{"', "a"]
    c.advance(ids('{"a": "x'))
    assert c.forced(8) == []  # the string goes on or ends: nothing fixed


def test_walk_cuts_the_draft_at_the_first_refused_token_and_settle_rolls_back(grammars):
    g = grammars.json_schema(SCHEMA)
    c = g.start()
    c.advance(ids('{"a": "'))
    draft = ids('ab", "b": ') + ids("x")  # 'x' where only true/false may come
    masks = c.walk(draft)
    assert masks.shape == (len(draft), len(PIECES))  # the last token refused: rows for the first d-1 and after them
    for k in range(len(draft)):  # accept k, recover one token: the state of a fresh walk of the same text
        c2 = g.start()
        c2.advance(ids('{"a": "'))
        c2.walk(draft)
        more = [t for t in range(len(PIECES)) if masks[k, t]][:1]
        c2.settle(k, more)
        fresh = g.start()
        fresh.advance(ids('{"a": "') + draft[:k] + more)
        assert torch.equal(c2.allowed(), fresh.allowed()), k
        assert c2.forced(8) == fresh.forced(8)
    with pytest.raises(RuntimeError, match="settle"):
        c.walk(draft)  # the last walk is still pending



def test_a_draft_through_the_answers_end_and_its_eos_rolls_back_exactly(grammars):
    """`}` completes the answer (the matcher stops) and the EOS after it is not a step of the
    matcher's history: rolling the draft back must not count it (else one token too many is
    undone, and the target's recovered token is refused)."""
    g = grammars.json_schema(SCHEMA)
    prefix = ids('{"a": "ab", "b": ')
    draft = ids("true}") + [EOS]
    for k in range(len(draft)):
        c = g.start()
        c.advance(prefix)
        masks = c.walk(draft)
        assert masks.shape[0] == len(draft) + 1  # every token allowed, EOS included
        more = ids("false")[:1] if k == 0 else ids("}") if k == 1 else [EOS]
        c.settle(k, more)
        fresh = g.start()
        fresh.advance(prefix + draft[:k] + more)
        assert torch.equal(c.allowed(), fresh.allowed()), k
    assert {PIECES[t] for t in c.allowed().nonzero().flatten().tolist()} == {"<eos>"}

def test_rows_of_a_walk_are_the_masks_after_each_prefix(grammars):
    g = grammars.json_schema(SCHEMA)
    text = ids('{"a": "ab", "b": false}')
    masks = g.start().walk(text)
    for i in range(len(text) + 1):
        c = g.start()
        c.advance(text[:i])
        assert torch.equal(masks[i], c.allowed()), i


@pytest.mark.parametrize("schema, problem", [
    ('{"type": ', "not valid JSON"),
    ("[1, 2]", "a JSON schema is an object"),
    ({"type": "object", "not": {"type": "string"}}, "not"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "sometype"}, "sometype"),
])
def test_a_bad_schema_is_a_value_error_naming_the_problem(grammars, schema, problem):
    with pytest.raises(ValueError, match=problem):
        grammars.json_schema(schema)


def test_json_object_takes_any_object_and_nothing_else(grammars):
    g = grammars.json_object()
    c = g.start()
    c.advance(ids('{"x": [1, 2], "y": {"a": true}}'))
    assert c.allowed()[EOS]
    assert not g.start().allowed()[PIECES.index("[")]  # an array is not an object


class Masks:
    """A constraint whose walk returns fixed masks: the maths alone."""

    def __init__(self, masks):
        self.masks = masks
        self.settled = None

    def walk(self, draft):
        n = next((i for i, t in enumerate(draft) if not self.masks[i, t]), len(draft))
        return self.masks[: n + 1]

    def settle(self, accepted, more):
        self.settled = (accepted, more)


class St:
    def __init__(self, constraint):
        self.constraint = constraint


def rule(st, prop, logits, params, seed):
    prop, masks = constrain(st, prop)
    rows = logits[: len(prop.tokens) + 1]  # [d+1, V], as Verifier.accept cuts them
    res, _ = Verifier(None, None, None).rule(rows, prop, params, torch.Generator().manual_seed(seed), masks)
    return prop, res


def test_acceptance_and_residual_use_the_masked_distributions():
    # V = 4, token 2 refused at the draft position. Target p = (.25, .25, .4, .1): p' = (5, 5, 0, 2) / 12;
    # draft q = (.1, .2, .6, .1): q' = (.25, .5, 0, .25). Draft x = 1: accepted with p'(1) / q'(1) = 5/6;
    # the residual max(0, p' - q') is 1/6 on token 0 alone, so a rejection recovers token 0, exactly
    # (unmasked, the residual would be mostly token 2, the refused one).
    allowed = torch.tensor([[True, True, False, True], [True, True, True, True]])
    p = torch.tensor([0.25, 0.25, 0.4, 0.1])
    logits = torch.stack([p.log(), torch.zeros(4)])  # [2, V]
    q = torch.tensor([[0.1, 0.2, 0.6, 0.1]])
    params = SamplingParams(temperature=1.0)
    accepted = 0
    for seed in range(600):
        prop, res = rule(St(Masks(allowed)), Proposal([1], q.clone()), logits, params, seed)
        assert torch.allclose(prop.probs[0], torch.tensor([0.25, 0.5, 0.0, 0.25]))
        if res.num_accepted:
            accepted += 1
        else:
            assert res.tokens == [0]  # recovered from the masked residual
    assert abs(accepted / 600 - 5 / 6) < 0.05


def test_a_refused_draft_token_cuts_the_draft_and_its_row_is_sampled_from_p_prime():
    allowed = torch.tensor([[True, True, False, True]] * 3)
    logits = torch.tensor([[0.0, 0.0, 9.0, 0.0]] * 3)  # the target's favourite is refused
    for seed in range(50):
        prop, res = rule(St(Masks(allowed)), Proposal([1, 2]), logits, SamplingParams(temperature=1.0), seed)
        assert prop.tokens == [1]  # token 2 refused at position 1: the draft ends before it
        assert 2 not in res.tokens


def test_greedy_takes_the_best_allowed_token():
    allowed = torch.tensor([[True, True, False, True]] * 3)
    logits = torch.tensor([[0.0, 1.0, 9.0, 0.5], [3.0, 1.0, 9.0, 0.5], [0.0, 0.0, 9.0, 0.5]])
    prop, res = rule(St(Masks(allowed)), Proposal([1, 0]), logits, SamplingParams(), 0)
    assert res.tokens == [1, 0, 3] and res.num_accepted == 2  # not the raw argmax 2 anywhere
    prop, res = rule(St(Masks(allowed)), Proposal([2, 0]), logits, SamplingParams(), 0)
    assert prop.tokens == [] and res.tokens == [1]  # the refused draft token never reaches the target


def test_a_forced_token_is_accepted_with_p_prime():
    # a one-hot draft (q = 1) of token 0 where the grammar allows tokens 0 and 1 with p' = (.75, .25)
    allowed = torch.tensor([[True, True, False, False], [True] * 4])
    logits = torch.stack([torch.tensor([0.75, 0.25, 0.5, 0.5]).log(), torch.zeros(4)])
    n = sum(rule(St(Masks(allowed)), Proposal([0]), logits, SamplingParams(temperature=1.0), s)[1].num_accepted
            for s in range(800))
    assert abs(n / 800 - 0.75) < 0.05


def test_a_candidate_tree_is_verified_as_its_first_chain_under_a_grammar():
    from draftwise.constrained import chain

    tree = Proposal([1, 3, 0], parents=[-1, 0, -1])  # 1 -> 3, and 0 beside 1
    assert chain(tree).tokens == [1, 3] and not chain(tree).is_tree
    allowed = torch.ones(3, 4, dtype=torch.bool)
    prop, masks = constrain(St(Masks(allowed)), tree)
    assert prop.tokens == [1, 3] and masks.shape == (3, 4)
