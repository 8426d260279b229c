"""The llama.cpp runner on the packaged smollm2-135m: KV bookkeeping, batching, greedy identity."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp")

from draftwise.backends.llama_runner import LlamaRunner  # noqa: E402
from draftwise.drafters.model import ModelDrafter  # noqa: E402
from draftwise.drafters.ngram import NgramDrafter  # noqa: E402
from draftwise.engine import Engine  # noqa: E402
from draftwise.models.load import load_llama  # noqa: E402

MODEL = "smollm2-135m"
N_CTX = 512
# One thread: on a busy machine a second spin-waiting ggml thread makes each forward take seconds.
THREADS = 1

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three facts about the Moon.",
    "Explain what a hash map is in two sentences.",
]


@pytest.fixture(scope="module")
def loaded():
    runner, tok = load_llama(MODEL, threads=THREADS, n_ctx=N_CTX, n_seq_max=4)
    yield runner, tok
    runner.close()


@pytest.fixture(scope="module")
def runner(loaded):
    return loaded[0]


@pytest.fixture(scope="module")
def tok(loaded):
    return loaded[1]


@pytest.fixture(scope="module")
def draft_runner(runner):
    r = LlamaRunner(runner.model_path, n_ctx=N_CTX, n_seq_max=2, n_threads=THREADS)
    yield r
    r.close()


@pytest.fixture
def seqs(runner):
    """Hands out sequences and frees them after the test, so one failure does not leak into others."""
    made = []

    def make():
        made.append(runner.new_sequence())
        return made[-1]

    yield make
    for s in made:
        runner.free(s)


def _chat(tok, text):
    return tok.apply_chat([{"role": "user", "content": text}])


def test_shape_and_attributes(runner, tok, seqs):
    assert runner.backend == "llama.cpp"
    assert runner.max_context == N_CTX
    assert runner.vocab_size >= len(tok.hf.get_vocab()) - 1 > 1000
    s = seqs()
    ids = _chat(tok, PROMPTS[0])
    out = runner.forward([s], [ids], [3])
    assert len(out) == 1 and out[0].shape == (3, runner.vocab_size) and out[0].dtype == torch.float32
    assert torch.isfinite(out[0]).all()
    none = runner.forward([s], [[ids[0]]], [0])[0]
    assert none.shape == (0, runner.vocab_size)
    assert runner.length(s) == len(ids) + 1


def test_truncate_then_refeed_gives_the_same_logits(runner, tok, seqs):
    s = seqs()
    ids = _chat(tok, PROMPTS[1])
    L = len(ids)
    runner.forward([s], [ids], [0])
    assert runner.length(s) == L
    kv = runner.kv_bytes()
    assert kv > 0
    new = [tok.encode(" The")[0], 1234, 5678, 42, 777, 4096]
    first = runner.forward([s], [new], [len(new)])[0]  # [6, V]
    assert runner.length(s) == L + 6
    assert runner.kv_bytes() > kv

    runner.truncate(s, L + 2)
    assert runner.length(s) == L + 2
    again = runner.forward([s], [new[2:]], [4])[0]  # [4, V]
    assert runner.length(s) == L + 6
    torch.testing.assert_close(again, first[2:], atol=1e-3, rtol=0)

    runner.truncate(s, L)  # back to the prompt, then one token at a time
    steps = torch.cat([runner.forward([s], [[t]], [1])[0] for t in new])
    torch.testing.assert_close(steps, first, atol=1e-3, rtol=0)

    runner.truncate(s, runner.length(s))  # a no-op
    with pytest.raises(ValueError, match="cannot truncate"):
        runner.truncate(s, runner.length(s) + 1)
    before = runner.kv_bytes()
    runner.free(s)
    assert runner.kv_bytes() < before


def test_two_sequences_in_one_forward_match_each_alone(runner, tok, seqs):
    a, b = seqs(), seqs()
    pa, pb = _chat(tok, PROMPTS[0]), _chat(tok, PROMPTS[2])
    runner.forward([a, b], [pa, pb], [0, 0])
    xa, xb = [11, 22, 33, 44], [55, 66]
    both = runner.forward([a, b], [xa, xb], [4, 1])  # ragged: 4 and 2 tokens, logits 4 and 1
    assert [t.shape[0] for t in both] == [4, 1]
    assert (runner.length(a), runner.length(b)) == (len(pa) + 4, len(pb) + 2)

    runner.truncate(a, len(pa))
    runner.truncate(b, len(pb))
    alone_a = runner.forward([a], [xa], [4])[0]
    alone_b = runner.forward([b], [xb], [1])[0]
    torch.testing.assert_close(both[0], alone_a, atol=1e-3, rtol=0)
    torch.testing.assert_close(both[1], alone_b, atol=1e-3, rtol=0)

    # truncating a must not touch b's cells: b's next logits match a fresh b that never shared a batch
    runner.truncate(a, 3)
    assert runner.length(b) == len(pb) + 2
    next_b = runner.forward([b], [[99]], [1])[0]
    c = seqs()
    runner.forward([c], [pb], [0])
    runner.forward([c], [xb], [0])
    torch.testing.assert_close(runner.forward([c], [[99]], [1])[0], next_b, atol=1e-3, rtol=0)

    with pytest.raises(ValueError, match="only once"):
        runner.forward([a, a], [[1], [2]], [1, 1])


def test_batches_past_n_batch_are_split(runner, tok):
    small = LlamaRunner(runner.model_path, n_ctx=64, n_batch=16, n_seq_max=1, n_threads=THREADS)
    try:
        ids = (_chat(tok, PROMPTS[0]) * 3)[:40]
        s, r = small.new_sequence(), runner.new_sequence()
        split = small.forward([s], [ids], [20])[0]  # 3 decodes: 16 + 16 + 8 tokens, logits in 2
        whole = runner.forward([r], [ids], [20])[0]
        runner.free(r)
        torch.testing.assert_close(split, whole, atol=1e-3, rtol=0)
        assert small.length(s) == 40
        # exactly full is allowed, one more is not
        small.forward([s], [ids[:24]], [1])
        assert small.length(s) == small.max_context == 64
        with pytest.raises(ValueError, match="exceed the context of 64"):
            small.forward([s], [[1]], [1])
        assert small.length(s) == 64
    finally:
        small.close()
    with pytest.raises(RuntimeError, match="closed"):
        small.forward([0], [[1]], [1])


def _top2_margin(runner, ids: list[int]) -> str:
    s = runner.new_sequence()
    try:
        logits = runner.forward([s], [ids], [1])[0][0]
    finally:
        runner.free(s)
    top = torch.topk(logits, 2)
    return f"top-2 {top.indices.tolist()} margin {float(top.values[0] - top.values[1]):.4f}"


def _assert_same(runner, prompt_ids, base, other, label):
    if other == base:
        return
    pos = next((i for i, (x, y) in enumerate(zip(base, other)) if x != y), min(len(base), len(other)))
    margin = _top2_margin(runner, prompt_ids + base[:pos])
    raise AssertionError(f"{label}: differs from plain greedy at generated position {pos} "
                         f"(plain {base[pos:pos + 3]}, {label} {other[pos:pos + 3]}); plain context {margin}")


def test_a_saved_state_restored_in_another_stream_continues_bit_identically(runner, tok, seqs):
    a, b = seqs(), seqs()
    ids = _chat(tok, PROMPTS[2])
    runner.forward([a], [ids], [0])
    state = runner.save(a)
    assert state.n == len(ids) and state.nbytes > 0 and runner.length(a) == len(ids)  # saving edits nothing
    runner.restore(b, state)
    assert runner.length(b) == len(ids)
    new = [tok.encode(" The")[0], 1234, 5678]
    ref = runner.forward([a], [new], [3])[0]
    assert torch.equal(runner.forward([b], [new], [3])[0], ref)  # the same cells, the same logits
    c = seqs()
    runner.restore(c, state)
    runner.truncate(c, len(ids) - 4)  # a shared prefix of the saved prompt, then the rest fed again
    torch.testing.assert_close(runner.forward([c], [ids[-4:] + new], [3])[0], ref, atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match="empty live sequence"):
        runner.restore(b, state)


def test_engine_with_a_prompt_cache_skips_prefills_and_keeps_greedy_outputs(runner, tok):
    ids = _chat(tok, PROMPTS[0])
    base = Engine(runner, tok).generate(ids, max_tokens=24)
    eng = Engine(runner, tok, NgramDrafter(1, 3), 4, prompt_cache_bytes=64 << 20)
    first = eng.generate(ids, max_tokens=24)
    again = eng.generate(ids, max_tokens=24)
    assert again.stats.cached_tokens == len(ids) and first.stats.cached_tokens == 0
    _assert_same(runner, ids, base.token_ids, first.token_ids, "uncached")
    assert again.token_ids == first.token_ids  # restored cells: the same computation
    grown = ids + tok.encode(" Answer in Python.")
    hit = eng.generate(grown, max_tokens=24)
    assert hit.stats.cached_tokens == len(ids)
    _assert_same(runner, grown, Engine(runner, tok).generate(grown, max_tokens=24).token_ids, hit.token_ids,
                 "cached prefix")
    assert runner.kv_bytes() == 0  # the cache holds copies, no live sequence


@pytest.mark.parametrize("prompt", PROMPTS)
def test_engine_greedy_identity(runner, draft_runner, tok, prompt):
    ids = _chat(tok, prompt)
    base = Engine(runner, tok).generate(ids, max_tokens=48)
    assert base.stats.emitted_tokens == len(base.token_ids) > 0
    ngram = Engine(runner, tok, NgramDrafter(1, 3), 4).generate(ids, max_tokens=48)
    _assert_same(runner, ids, base.token_ids, ngram.token_ids, "ngram")
    model = Engine(runner, tok, ModelDrafter(draft_runner), 4).generate(ids, max_tokens=48)
    _assert_same(runner, ids, base.token_ids, model.token_ids, "model drafter")
    # the same model drafting for itself: every draft is accepted
    assert model.stats.acceptance_rate == pytest.approx(1.0)


def test_llama_tokenizer_matches_transformers(runner, tok):
    chat = tok.hf.apply_chat_template([{"role": "user", "content": "Sort [3, 1, 2] in Python."}],
                                      add_generation_prompt=True, tokenize=False)
    texts = [
        "Hello, world!",
        "def add(a, b):\n    return a + b  # sum\n\n\tprint(add(1, 2))",
        "naïve café — 日本語のテキスト, emoji 🚀🔥, Ελληνικά",
        "   leading spaces and trailing   ",
        "x = {'k': [1, 2.5e-3, None]}; y = x['k'][-1] != 0x1F",
        chat,
    ]
    for text in texts:
        assert runner.tokenize(text) == tok.encode(text), text
    assert runner.tokenize("") == []


def test_too_many_sequences(runner, seqs):
    held = [seqs() for _ in range(runner.n_seq_max)]
    assert sorted(held) == list(range(runner.n_seq_max))
    with pytest.raises(ValueError, match=r"all 4 sequences .* in use"):
        runner.new_sequence()
    runner.free(held[1])
    assert runner.new_sequence() == held[1]  # ids are reused


def test_context_overflow_is_refused_and_leaves_state(runner, seqs):
    s = seqs()
    with pytest.raises(ValueError, match=f"exceed the context of {N_CTX} tokens"):
        runner.forward([s], [[1] * (N_CTX + 1)], [1])
    assert runner.length(s) == 0
    runner.forward([s], [[1, 2, 3]], [1])
    with pytest.raises(ValueError, match=f"holds 3 tokens; {N_CTX - 2} more"):
        runner.forward([s], [[1] * (N_CTX - 2)], [1])
    assert runner.length(s) == 3
    with pytest.raises(ValueError, match="not in use"):
        runner.forward([N_CTX], [[1]], [1])


def test_non_gguf_specs_are_refused(tmp_path):
    hf_dir = tmp_path / "hf-model"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="needs a GGUF model"):
        load_llama(str(hf_dir))
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        load_llama(str(missing))
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file" * 100)
    with pytest.raises(ValueError, match="junk.gguf"):
        LlamaRunner(str(junk))


def test_kernels_auto_with_a_drafter_takes_the_kernels_with_the_faster_measured_curve(monkeypatch, tmp_path):
    """`--kernels auto`: repacked for plain decoding; with a drafter, the kernels whose forwards of
    k = 1..8 cost less, measured side by side once and then read from the cache."""
    import json

    import draftwise.profile as profile
    from draftwise.build import EngineSpec, load_target

    monkeypatch.setattr(profile, "cache_dir", lambda: tmp_path)  # the choice only: models stay where they are
    monkeypatch.setattr(profile.os, "getloadavg", lambda: (0.5, 0.0, 0.0))  # kept whatever else runs
    assert EngineSpec(target=MODEL, backend="llama.cpp", drafter="none").kernels == "repacked"
    assert EngineSpec(target=MODEL, backend="llama.cpp", drafter="ngram", kernels="standard").kernels == "standard"
    chosen = []
    for _ in range(2):  # the second start reads the choice
        spec = EngineSpec(target=MODEL, backend="llama.cpp", drafter="ngram", max_context=N_CTX, threads=THREADS,
                          max_running=1)
        assert spec.kernels == "auto"  # settled when the target loads
        runner, _ = load_target(spec, log=lambda m: None)
        assert spec.kernels in ("standard", "repacked") and runner.fast_kernels == (spec.kernels == "repacked")
        chosen.append(spec.kernels)
        runner.close()
    (saved,) = (tmp_path / "choices").iterdir()
    got = json.loads(saved.read_text())
    assert chosen[0] == chosen[1] == min(got["ms"], key=got["ms"].get).split()[-1] == got["chosen"].split()[-1]
