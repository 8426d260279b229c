"""Engine logic on a toy runner: identity, KV bookkeeping, stops inside accepted runs, errors."""
import pytest

from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from fakes import CharTokenizer, CycleRunner

PROMPT = [0, 1, 2, 3, 4, 0, 1]  # "abcdeab": the cycle 0..4 repeats, so n-gram drafts are right


def run(drafter=None, d=4, **kw):
    runner = CycleRunner()
    eng = Engine(runner, CharTokenizer(), drafter, d)
    chunks = list(eng.stream(PROMPT, **kw))
    return runner, chunks, chunks[-1].result


def test_greedy_identity_and_stats():
    _, _, plain = run(max_tokens=20)
    assert plain.token_ids == [(2 + i) % 5 for i in range(20)]
    runner, chunks, spec = run(NgramDrafter(1, 3), 4, max_tokens=20)
    assert spec.token_ids == plain.token_ids
    s = spec.stats
    assert s.emitted_tokens == 20 and s.acceptance_rate == 1.0
    assert s.emitted_tokens == s.plain_steps + s.round_emitted_tokens
    assert s.acceptance_length == s.round_emitted_tokens / s.verification_rounds
    assert max(len(c.token_ids) for c in chunks) == 5  # D accepted + bonus in one round
    assert runner.seqs == {}  # the sequence was freed


def test_stop_string_inside_accepted_run():
    # prefill emits c; the first round emits d e a b (accepted) + c (bonus); "ea" completes at a
    _, chunks, r = run(NgramDrafter(1, 3), 4, max_tokens=20, stop=["ea"])
    assert r.token_ids == [2, 3, 4, 0] and r.text == "cd" and r.finish_reason == "stop"
    assert r.stats.discarded_tokens == 2  # b and c, emitted by the round after the stop
    assert r.stats.round_emitted_tokens == 3 and r.stats.acceptance_length == 3.0
    assert "".join(c.text for c in chunks) == "cd"


def test_eos_and_max_tokens_inside_accepted_run():
    runner = CycleRunner(period=16)  # counts up to 15 = EOS
    eng = Engine(runner, CharTokenizer(), NgramDrafter(1, 2), 8)
    prompt = list(range(16)) + [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    r = eng.generate(prompt, max_tokens=50)
    assert r.token_ids == [10, 11, 12, 13, 14, 15] and r.finish_reason == "stop" and r.text == "klmno"
    r = eng.generate(prompt, max_tokens=3)
    assert r.token_ids == [10, 11, 12] and r.finish_reason == "length"
    assert r.stats.emitted_tokens == 3


def test_kv_invariant_after_rejections():
    class WrongDrafter(NgramDrafter):  # proposes one right token then a wrong one
        def propose(self, key, ctx, n, params, gen):
            p = super().propose(key, ctx, n, params, gen)
            if len(p.tokens) >= 2:
                p.tokens[1] = (p.tokens[1] + 2) % 5
            return p
    runner = CycleRunner()
    eng = Engine(runner, CharTokenizer(), WrongDrafter(1, 3), 4)
    seen = []
    for chunk in eng.stream(PROMPT, max_tokens=12):
        if chunk.result is None:
            (seq,) = runner.seqs
            seen.append(runner.length(seq))
    r = chunk.result
    assert r.token_ids == [(2 + i) % 5 for i in range(12)]
    assert r.stats.accepted_per_position[:2] == [r.stats.verification_rounds, 0]
    # the target KV always holds every committed token but the last
    # (7 prompt tokens; after the first token, five rounds of 1 accepted + 1 recovered; the 12th
    # token comes from a plain step, whose chunk carries the result)
    assert seen == [7, 9, 11, 13, 15, 17] and r.stats.verification_rounds == 5


def test_sampling_seeded_determinism():
    a = run(NgramDrafter(1, 3), 4, max_tokens=30, temperature=1.5, seed=5)[2]
    b = run(NgramDrafter(1, 3), 4, max_tokens=30, temperature=1.5, seed=5)[2]
    c = run(NgramDrafter(1, 3), 4, max_tokens=30, temperature=1.5, seed=6)[2]
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


@pytest.mark.parametrize("kw,msg", [
    ({"max_tokens": 600}, "exceeds the context"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"stop": [""]}, "stop strings"),
    ({"num_draft_tokens": -1}, "num_draft_tokens"),
])
def test_invalid_requests(kw, msg):
    eng = Engine(CycleRunner(), CharTokenizer(), NgramDrafter(1, 3), 4)
    with pytest.raises(ValueError, match=msg):
        eng.generate(PROMPT, **kw)


def test_bad_prompts():
    eng = Engine(CycleRunner(), CharTokenizer())
    with pytest.raises(ValueError, match="empty"):
        eng.generate([])
    with pytest.raises(ValueError, match="out of range"):
        eng.generate([3, 99])


def test_reuse_prefix_skips_the_prompt_forward_and_keeps_results():
    fresh = [run(NgramDrafter(1, 3), 4, max_tokens=10, temperature=1.0, seed=s)[2].token_ids for s in (1, 2)]
    runner = CycleRunner()
    fed, forward = [], runner.forward  # tokens fed per forward call
    runner.forward = lambda seqs, toks, ks, *a: fed.append(sum(map(len, toks))) or forward(seqs, toks, ks, *a)
    eng = Engine(runner, CharTokenizer(), NgramDrafter(1, 3), 4, reuse_prefix=True)
    reused = []
    for s in (1, 2):
        n_before = len(fed)
        reused.append(eng.generate(PROMPT, max_tokens=10, temperature=1.0, seed=s).token_ids)
        (seq,) = runner.seqs
        assert runner.seqs[seq] == PROMPT  # kept, rolled back to the prompt
    assert reused == fresh
    assert fed[0] == len(PROMPT)  # the first request's prefill
    # the second request forwarded no prompt: every forward after the first request is a step
    # ([last] + a draft of at most 4)
    assert fed[n_before:] and max(fed[n_before:]) <= 1 + 4
    eng.generate([1, 2, 3], max_tokens=2)  # another prompt replaces the kept one
    assert list(runner.seqs.values()) == [[1, 2, 3]]


def test_round_trace_positions():
    _, _, r = run(NgramDrafter(1, 3), 4, max_tokens=12)
    # after the prefill token, 4 proposed, 4 accepted, a bonus; again at position 6; at 11 one token
    # is left, so no draft: a plain step
    assert r.rounds == [(1, 4, 4, False, False), (6, 4, 4, False, False)] and r.stats.plain_steps == 2
    assert sum(a + 1 for _, _, a, *_ in r.rounds) + r.stats.plain_steps == r.stats.emitted_tokens == 12


def test_stream_chunks_carry_their_rounds():
    eng = Engine(CycleRunner(), CharTokenizer(), NgramDrafter(1, 3), 4)
    chunks = list(eng.stream(PROMPT, max_tokens=12))
    # the prefill's token and the last plain step carry none; each round's chunk holds its tokens
    assert [c.round for c in chunks if c.round is not None] == chunks[-1].result.rounds
    assert [len(c.token_ids) for c in chunks] == [1, 5, 5, 1] and chunks[0].round is None is chunks[-1].round


def test_a_cancelled_request_keeps_its_prompt_for_the_next():
    runner = CycleRunner()
    fed, forward = [], runner.forward
    runner.forward = lambda seqs, toks, ks, *a: fed.append(sum(map(len, toks))) or forward(seqs, toks, ks, *a)
    eng = Engine(runner, CharTokenizer(), NgramDrafter(1, 3), 4, reuse_prefix=True)
    for chunk in eng.stream(PROMPT, max_tokens=20):
        break  # the consumer stops after the prefill's token: the request is dropped
    (seq,) = runner.seqs
    assert runner.seqs[seq] == PROMPT and fed == [len(PROMPT)]
    full = eng.generate(PROMPT, max_tokens=12)
    assert len(fed) > 1 and max(fed[1:]) <= 1 + 4  # no prompt forward again
    assert full.token_ids == Engine(CycleRunner(), CharTokenizer(), NgramDrafter(1, 3), 4).generate(
        PROMPT, max_tokens=12).token_ids


def test_release_frees_the_kept_prompt():
    runner = CycleRunner()
    eng = Engine(runner, CharTokenizer(), NgramDrafter(1, 3), 4, reuse_prefix=True)
    eng.generate(PROMPT, max_tokens=4)
    assert len(runner.seqs) == 1
    eng.release()
    assert runner.seqs == {}


def test_a_stream_runs_only_while_it_is_read():
    runner = CycleRunner()
    eng = Engine(runner, CharTokenizer(), NgramDrafter(1, 3), 4)
    unread = eng.stream(PROMPT, max_tokens=8)  # validated now, run only when read
    assert runner.forwards == []
    it = eng.stream(PROMPT, max_tokens=30)
    next(it)
    assert runner.seqs and all(len(f) == 1 for f in runner.forwards)  # the unread request never ran
    it.close()  # a consumer that stops early: its KV state is freed at once
    assert runner.seqs == {}
    assert eng.generate(PROMPT, max_tokens=8).token_ids == next(
        c for c in unread if c.result is not None).result.token_ids
