import pytest
import torch

from draftwise import sampling
from draftwise.sampling import SamplingParams, argmax, top_p_filter, warp


def test_temperature_top_k_top_p_exact():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.10]]))
    p = warp(logits, SamplingParams(temperature=1.0))
    assert torch.allclose(p, torch.tensor([[0.5, 0.25, 0.15, 0.10]]))
    p = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    # top_p = 0.7: 0.5 alone is short of 0.7, 0.5 + 0.25 reaches it -> keep two tokens
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(p, torch.tensor([[2 / 3, 1 / 3, 0.0, 0.0]]))
    p = warp(logits, SamplingParams(temperature=1.0, top_p=0.5))  # the first token alone reaches it
    assert torch.allclose(p, torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    # temperature 2 flattens: p ∝ sqrt(p)
    p = warp(logits, SamplingParams(temperature=2.0))
    s = torch.sqrt(torch.tensor([0.5, 0.25, 0.15, 0.10]))
    assert torch.allclose(p[0], s / s.sum())


@pytest.mark.parametrize("kw,msg", [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                                    ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k")])
def test_invalid_params(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kw)


def test_greedy_has_no_warp():
    with pytest.raises(ValueError):
        warp(torch.zeros(1, 3), SamplingParams())


def test_tiny_temperature_is_greedy_not_nan():
    # found by schemathesis against the server: temperature 1.4e-45 made logits / T overflow
    import torch

    from draftwise.sampling import SamplingParams
    from draftwise.sampling import GREEDY_BELOW

    p = SamplingParams(1.401298464324817e-45)
    assert p.greedy and SamplingParams(GREEDY_BELOW * 0.999).greedy
    assert not SamplingParams(GREEDY_BELOW).greedy
    with pytest.raises(ValueError, match="greedy"):
        warp(torch.tensor([[1.0, 3.0, 2.0]]), p)
    # the smallest sampled temperature warps to finite probabilities, even from large logits
    for logits in (torch.tensor([[1.0, 3.0, 2.0]]), torch.tensor([[1e3, 3e3, 2e3]])):
        assert torch.equal(warp(logits, SamplingParams(GREEDY_BELOW)), torch.tensor([[0.0, 1.0, 0.0]]))
    # and a request at the tiny temperature decodes greedily through the engine
    from fakes import CharTokenizer, CycleRunner

    from draftwise.engine import Engine
    eng = Engine(CycleRunner(), CharTokenizer())
    assert eng.generate([0], max_tokens=3, temperature=1.401298464324817e-45).token_ids == [1, 2, 3]


@pytest.mark.parametrize("top_p", [5e-324, 1e-45, 1e-9])
def test_tiny_top_p_keeps_the_top_token(top_p):
    """A top_p that rounds to 0 in float32 (schemathesis sent 5e-324) still keeps the most likely
    token instead of dropping everything (which made the probabilities NaN)."""
    logits = torch.log(torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3]]))
    p = warp(logits, SamplingParams(temperature=1.0, top_p=top_p))
    assert torch.equal(p, torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))


def test_argmax_is_torch_argmax_first_of_ties_any_layout():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 5.0, 5.0, 5.0], [-1.0, -2.0, -1.0, -3.0]])
    assert argmax(logits).tolist() == [1, 0, 0]  # the first of equal maxima
    assert argmax(logits[1]).tolist() == 0  # one row: a 0-d tensor, as torch.argmax(-1)
    assert argmax(logits.t()).tolist() == [1, 1, 1, 1]  # a transposed (non-contiguous) view
    g = torch.Generator().manual_seed(0)
    big = torch.randn(2, 5, 151936, generator=g)
    for x in (big, big.half(), big.bfloat16(), big[:, ::2]):
        got = argmax(x)
        assert got.dtype == torch.int64 and torch.equal(got, x.argmax(-1))


def full_sort_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The reference: sort every row in full and keep the smallest prefix reaching top_p."""
    vals, order = torch.sort(probs, dim=-1, descending=True)
    drop = (vals.cumsum(-1) - vals) >= top_p
    drop[..., 0] = False
    out = torch.zeros_like(probs).scatter_(-1, order, vals.masked_fill(drop, 0.0))
    return out / out.sum(-1, keepdim=True)


@pytest.mark.parametrize("top_p", [1e-9, 0.3, 0.9, 0.95, 0.999])
def test_top_p_among_candidates_keeps_what_a_full_sort_keeps(top_p, monkeypatch):
    g = torch.Generator().manual_seed(1)
    # peaked rows (the nucleus among the candidates), flat rows (sorted in full), and both in one batch
    logits = torch.cat([6 * torch.randn(3, 151936, generator=g), 0.1 * torch.randn(2, 151936, generator=g)])
    probs = torch.softmax(logits, -1)
    want = full_sort_top_p(probs, top_p)
    assert torch.equal(top_p_filter(probs, top_p), want)
    for rows in (probs[3:], probs[:1]):  # alone (a row's sum can round differently in another batch)
        assert torch.equal(top_p_filter(rows, top_p), full_sort_top_p(rows, top_p))
    monkeypatch.setattr(sampling, "TOP_P_CANDIDATES", 4)  # few candidates: more rows sorted in full
    assert torch.equal(top_p_filter(probs, top_p), want)
