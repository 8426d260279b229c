"""Real small models on the torch backend: greedy identity, determinism, stops, vocab checks."""
import pytest
import torch

from draftwise.compare import divergence_report
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.models.load import load_torch
from draftwise.prompts import edit_eval, humaneval, spec_bench

MAX = 48


@pytest.fixture(scope="module")
def smol():
    return load_torch("smollm2-135m", threads=2)


def _prompts(tok):
    return [edit_eval(1)[0].token_ids(tok), humaneval(1)[0].token_ids(tok),
            spec_bench(("writing",), 1)[0].token_ids(tok)]


def _assert_identical(runner, prompt, plain, spec):
    div = divergence_report(runner, prompt, plain.token_ids, spec.token_ids)
    assert div is None, f"greedy divergence: {div}"


def test_ngram_greedy_identity(smol):
    runner, tok = smol
    plain_engine, spec_engine = Engine(runner, tok), Engine(runner, tok, NgramDrafter(1, 3), 5)
    proposed = 0
    for ids in _prompts(tok):
        plain = plain_engine.generate(ids, max_tokens=MAX)
        spec = spec_engine.generate(ids, max_tokens=MAX)
        _assert_identical(runner, ids, plain, spec)
        proposed += spec.stats.proposed_tokens
    assert proposed > 0  # the drafter was exercised


def test_model_drafter_greedy_identity(smol):
    runner, tok = smol
    draft_runner, _ = load_torch("smollm2-135m", threads=2)  # its own KV owner
    ids = _prompts(tok)[0]
    plain = Engine(runner, tok).generate(ids, max_tokens=MAX)
    spec = Engine(runner, tok, ModelDrafter(draft_runner), 4).generate(ids, max_tokens=MAX)
    _assert_identical(runner, ids, plain, spec)
    assert spec.stats.acceptance_rate > 0.9  # a model drafting for itself is (nearly) always right
    assert draft_runner._caches == {}  # the draft sequence was released


def test_prompt_cache_restores_the_same_cache(smol):
    runner, tok = smol
    ids = _prompts(tok)[1]
    a = runner.new_sequence()
    runner.forward([a], [ids], [0])
    state = runner.save(a)
    b = runner.new_sequence()
    runner.restore(b, state)
    ref = runner.forward([a], [ids[:3]], [3])[0]
    assert torch.equal(runner.forward([b], [ids[:3]], [3])[0], ref)  # the same tensors, the same logits
    c = runner.new_sequence()
    runner.restore(c, state)
    runner.truncate(c, len(ids) - 5)
    torch.testing.assert_close(runner.forward([c], [ids[-5:] + ids[:3]], [3])[0], ref, atol=1e-4, rtol=0)
    d = runner.new_sequence()  # a sequence cut back to its prompt: its saved copy holds the prompt only
    runner.forward([d], [ids + ids], [0])
    runner.truncate(d, len(ids))
    cut = runner.save(d)
    held = sum(t.untyped_storage().nbytes() for layer in cut.data.layers for t in (layer.keys, layer.values))
    assert cut.n == len(ids) and cut.nbytes == state.nbytes == held
    for s in (a, b, c, d):
        runner.free(s)
    eng = Engine(runner, tok, NgramDrafter(1, 3), 5, prompt_cache_bytes=256 << 20)
    plain = Engine(runner, tok).generate(ids, max_tokens=16)
    first, again = (eng.generate(ids, max_tokens=16) for _ in range(2))
    assert first.token_ids == again.token_ids == plain.token_ids and again.stats.cached_tokens == len(ids)


def test_seeded_sampling_is_reproducible(smol):
    runner, tok = smol
    ids = _prompts(tok)[2]
    eng = Engine(runner, tok, NgramDrafter(1, 3), 4)
    a = eng.generate(ids, max_tokens=24, temperature=0.9, top_p=0.95, seed=123)
    b = eng.generate(ids, max_tokens=24, temperature=0.9, top_p=0.95, seed=123)
    c = eng.generate(ids, max_tokens=24, temperature=0.9, top_p=0.95, seed=124)
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_stop_string_in_accepted_run_real(smol):
    runner, tok = smol
    ids = _prompts(tok)[0]  # a code edit: long accepted runs
    eng = Engine(runner, tok, NgramDrafter(1, 3), 6)
    chunks = list(eng.stream(ids, max_tokens=MAX))
    full = chunks[-1].result
    # pick a token in the middle of a multi-token round whose text first appears there
    pos = 0
    for c in chunks:
        for j in range(1, len(c.token_ids) - 1):
            i = pos + j
            piece = tok.decode([full.token_ids[i]]).strip()
            before = tok.decode(full.token_ids[:i])
            if len(piece) >= 2 and piece not in before and piece in tok.decode(full.token_ids[: i + 1]):
                r = eng.generate(ids, max_tokens=MAX, stop=[piece])
                assert r.token_ids == full.token_ids[: i + 1]
                assert r.text == tok.decode(full.token_ids[: i + 1]).split(piece)[0]
                assert r.finish_reason == "stop" and r.stats.discarded_tokens >= 1
                return
        pos += len(c.token_ids)
    pytest.fail("no multi-token round with a usable stop string")


def test_context_overflow_is_refused(smol):
    runner, tok = smol
    with pytest.raises(ValueError, match="exceeds the context"):
        Engine(runner, tok, NgramDrafter(), 8).generate([1] * (runner.max_context - 10), max_tokens=8)


@pytest.mark.slow
def test_qwen_pair_greedy_identity():
    """Qwen2.5-Coder 0.5B drafting for the 1.5B, torch fp32: token-for-token identical."""
    target, tok = load_torch("qwen2.5-coder-1.5b", threads=2)
    draft, _ = load_torch("qwen2.5-coder-0.5b", threads=2)
    spec_engine = Engine(target, tok, ModelDrafter(draft), 4)
    for p in (edit_eval(1)[0], humaneval(1)[0]):
        ids = p.token_ids(tok)
        plain = Engine(target, tok).generate(ids, max_tokens=24)
        spec = spec_engine.generate(ids, max_tokens=24)
        _assert_identical(target, ids, plain, spec)
        assert spec.stats.accepted_draft_tokens > 0
