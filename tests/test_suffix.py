"""The suffix drafter: exact proposals from hand-built sequences, the global trie across requests,
privacy, the memory cap, and lossless decoding through the engine."""
import httpx
import pytest

from draftwise.drafters.suffix import SuffixDrafter, SuffixTrie
from draftwise.engine import Engine
from draftwise.sampling import SamplingParams
from fakes import CharTokenizer, CycleRunner

G = SamplingParams()


def propose(d, key, ctx, n=8):
    p = d.propose(key, ctx, n, G, None)
    return p.tokens, p.confidence


def run(d, key, prompt, out):
    """A request as the loop drives it: proposals after its first token, then after the rest."""
    propose(d, key, prompt + out[:1])
    propose(d, key, prompt + out)


def test_worked_example_of_the_docstring():
    assert propose(SuffixDrafter(depth=8, max_match=4), 1, [5, 6, 7, 9, 5, 6, 7, 9, 5, 6], 3) == ([7, 9, 5], [1.0, 1.0, 1.0])


def test_most_frequent_continuation_and_its_score():
    d = SuffixDrafter(depth=6, max_match=3, min_score=0.5)
    # after [1 2]: 3 twice, 4 once; after [1 2 3]: 9 both times
    toks, conf = propose(d, 1, [1, 2, 3, 9, 1, 2, 4, 1, 2, 3, 9, 8, 1, 2])
    assert toks == [3, 9] and conf == pytest.approx([2 / 3, 2 / 3])
    d.min_score = 0.7  # the first token's score already falls below the bar: nothing to propose
    assert propose(d, 1, [1, 2, 3, 9, 1, 2, 4, 1, 2, 3, 9, 8, 1, 2]) == ([], None)


def test_longest_match_wins_and_a_new_context_finds_nothing():
    d = SuffixDrafter(depth=8, max_match=4, min_match=2)
    # [7 1 2] continued with 5; [1 2] alone more often with 6: the longest match decides
    assert propose(d, 1, [7, 1, 2, 5, 0, 1, 2, 6, 0, 1, 2, 6, 0, 7, 1, 2], 1)[0] == [5]
    assert propose(d, 2, [10, 11, 12, 13], 4) == ([], None)


def test_outputs_of_finished_requests_feed_later_requests_unless_private():
    d = SuffixDrafter(depth=8, max_match=4)
    prompt, out = [1, 2, 3], [20, 21, 22, 23, 24, 25]
    run(d, 1, prompt, out)
    d.release(1)
    assert propose(d, 2, [9, 9, 20, 21], 3)[0] == [22, 23, 24]  # another prompt, the same output text
    d.private.add(3)
    assert propose(d, 3, [9, 9, 20, 21], 3) == ([], None)  # a private request does not read it
    propose(d, 3, [9, 9, 20, 21, 30, 31, 32])  # its output: [21 30 31 32]
    d.release(3)
    assert propose(d, 4, [0, 30, 31], 1) == ([], None)  # nor feed it
    assert SuffixDrafter(share=False).propose(5, [9, 20, 21], 3, G, None).tokens == []


def test_the_global_trie_stays_under_its_cap_evicting_the_oldest():
    d = SuffixDrafter(depth=4, max_match=3, max_nodes=60)
    for k in range(20):
        out = [100 + 10 * k + i for i in range(8)]  # no two outputs share a token
        run(d, k, [1], out)
        d.release(k)
        assert d.memory_nodes() <= 60
    assert propose(d, 99, [0, 290, 291], 2)[0] == [292, 293]  # the newest is kept
    assert propose(d, 98, [0, 100, 101], 2) == ([], None)  # the oldest is gone


def test_a_trie_of_any_size_adds_nothing_per_node_for_the_garbage_collector_to_walk():
    import gc
    t = SuffixTrie(24)
    t.add(list(range(500)) * 2)
    assert t.nodes > 10_000 and not any(gc.is_tracked(k) for k in t.kids)


def test_adding_and_removing_a_sequence_leaves_an_empty_trie():
    t = SuffixTrie(5)
    t.add([1, 2, 1, 2, 3, 1, 2])
    t.add([2, 1, 2, 3])
    t.add([1, 2, 1, 2, 3, 1, 2], sign=-1)
    t.add([2, 1, 2, 3], sign=-1)
    assert t.nodes == 1 and t.kids[0] == {} and len(t._free) == len(t.kids) - 1  # every other id free for reuse


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.9, seed=3)])
def test_decoding_with_the_suffix_drafter_is_plain_decoding(params):
    runner = CycleRunner(period=7)
    kw = dict(max_tokens=40, temperature=params.temperature, seed=params.seed)
    prompt = [0, 1, 2, 3, 4, 5, 6, 0, 1]
    plain = Engine(runner, CharTokenizer()).generate(prompt, **kw)
    spec = Engine(runner, CharTokenizer(), SuffixDrafter(), 6).generate(prompt, **kw)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.proposed_tokens > 0 and runner.seqs == {}
    if params.greedy:
        assert spec.stats.acceptance_rate == 1.0  # the cycle repeats: every suffix proposal is right


def test_a_finished_request_joins_the_global_trie_to_its_last_token():
    # the loop proposes before each round, so the last round's tokens reach the drafter only as the
    # request ends: without them the same prompt asked again would draft all but its answer's end
    d = SuffixDrafter()
    prompt = [9, 10, 11]
    first = Engine(CycleRunner(), CharTokenizer(), d, 4).generate(prompt, max_tokens=8)
    assert first.token_ids == [2, 3, 4, 0, 1, 2, 3, 4]
    assert d.global_trie.find(prompt[-2:] + first.token_ids) is not None
    again = Engine(CycleRunner(), CharTokenizer(), d, 8).generate(prompt, max_tokens=8)
    assert again.token_ids == first.token_ids
    assert again.stats.verification_rounds == 1 and again.stats.accepted_draft_tokens == 6  # first token, 6 drafted, bonus


def test_a_finished_request_joins_the_global_trie_up_to_its_eos():
    # the round that drafted the EOS verified tokens after it too (the cycle goes on 15 -> 0 -> 1):
    # the request ends at the EOS, and the trie must not learn what the target never delivered
    d = SuffixDrafter(max_match=2)  # stores the prompt's last token before the output
    prompt = [12, 13, 14, 15, 0, 1, 2, 12]  # "12 13" is followed by 14 15 0 1 2 in the prompt
    r = Engine(CycleRunner(vocab=16, period=16), CharTokenizer(eos=15), d, 4).generate(prompt, max_tokens=20)
    assert r.token_ids == [13, 14, 15] and r.finish_reason == "stop"
    assert r.stats.accepted_draft_tokens == 4 and r.stats.discarded_tokens == 3  # 0 1 and the bonus: cut by the EOS
    assert d.global_trie.find([12, 13, 14, 15]) is not None and d.global_trie.find([15, 0]) is None


def test_the_longer_match_wins_across_tries():
    d = SuffixDrafter(depth=8, max_match=6)
    run(d, 1, [0], [9, 1, 2, 3, 4, 5, 6])
    d.release(1)  # the global trie: [1 2 3 4] -> 5
    # the request's own tokens: [3 4] -> 8 (a shorter match); the global trie's longer one wins
    assert propose(d, 2, [3, 4, 8, 7, 1, 2, 3, 4], 2)[0] == [5, 6]
    assert propose(d, 3, [7, 8, 2, 0, 7, 8], 1)[0] == [2]  # only the request's own matches


def test_a_tie_between_tries_goes_to_the_copy_the_target_followed():
    d = SuffixDrafter(depth=8, max_match=3)
    # four passages, each continued one way by an earlier output (the global trie) and another
    # by the prompt (the request's trie): [1 2 3] -> 5 | 4, [6 7 8] -> 11 | 10, [12 13 14] -> 16 | 15,
    # [17 18 19] -> 21 | 20; every lookup below is a tie (equally long matches, score 1 each)
    run(d, 1, [0], [9, 1, 2, 3, 5, 6, 7, 8, 11, 12, 13, 14, 16, 17, 18, 19, 21])
    d.release(1)
    ctx = [1, 2, 3, 4, 6, 7, 8, 10, 12, 13, 14, 15, 17, 18, 19, 20, 0, 1, 2, 3]
    assert propose(d, 2, ctx, 1)[0] == [5]  # the earlier output first
    ctx += [4, 0, 6, 7, 8]  # the target wrote 4, not the draft's 5: the other trie wins the next tie
    assert propose(d, 2, ctx, 1)[0] == [10]
    ctx += [10, 0, 12, 13, 14]  # it followed that draft: the same trie again
    assert propose(d, 2, ctx, 1)[0] == [15]
    ctx += [16, 0, 17, 18, 19]  # it departed from it: back to the global one
    assert propose(d, 2, ctx, 1)[0] == [21]


def test_server_private_requests_and_the_shared_trie_metric():
    """Through the HTTP server: a request with "private": true leaves the global trie as it was;
    a shared one grows it, and /metrics reports its size."""
    import re

    from draftwise.policy import FixedDraftLength
    from draftwise.scheduler import Scheduler
    from draftwise.server.load import Tokenizers
    from serving import ChatChars, LiveServer, Runner

    sfx = SuffixDrafter()

    def build(cfg, observer):
        tok = ChatChars()
        return Scheduler(Runner(period=15), tok, sfx, FixedDraftLength(4), max_running=4, max_queue=cfg.max_queue,
                         observer=observer, reserve_draft=False), Tokenizers(tok)

    def nodes(srv):
        text = httpx.get(srv.url + "/metrics").text
        return int(float(re.search(r"^draftwise:drafter_shared_nodes\{[^}]*\} (\S+)$", text, re.M).group(1)))

    srv = LiveServer(build)
    try:
        empty = nodes(srv)
        body = {"model": "smollm2-135m", "prompt": "abcdabcd", "max_tokens": 12}
        assert srv.post("/v1/completions", json=body | {"private": True}).status_code == 200
        assert nodes(srv) == empty == sfx.memory_nodes()
        assert srv.post("/v1/completions", json=body).status_code == 200
        assert nodes(srv) == sfx.memory_nodes() > empty
    finally:
        srv.close()


def test_a_walk_cut_by_the_trie_depth_re_anchors_and_goes_on():
    d = SuffixDrafter(depth=6, max_match=3, min_match=2)
    out = list(range(100, 120))  # 20 distinct tokens: a passage the trie holds in 6-token pieces
    run(d, 1, [1], out)
    d.release(1)
    toks, conf = propose(d, 2, [7, 100, 101, 102], 12)  # match of 3: walk 3, re-anchor, ...
    assert toks == list(range(103, 115)) and conf == [1.0] * 12
    assert propose(d, 3, [7, 117, 118], 5)[0] == [119]  # the passage's end: nothing after it
    d2 = SuffixDrafter(depth=6, max_match=3, min_match=2, min_score=0.6)
    # after [1 2 3]: 4 then 5 then 6 (depth 6 reached), then [4 5 6] goes on to 7 once and 8 once
    seq = [1, 2, 3, 4, 5, 6, 7, 0, 4, 5, 6, 8, 0, 1, 2, 3]
    toks, conf = propose(d2, 4, seq, 6)
    assert toks == [4, 5, 6] and conf == [1.0, 1.0, 1.0]  # 7 or 8: score 0.5 < 0.6 stops it


def test_the_same_prompt_asked_again_drafts_from_its_first_token():
    d = SuffixDrafter(depth=8, max_match=4)
    prompt, out = [1, 2, 3, 4, 5], [20, 21, 22, 23]
    run(d, 1, prompt, out)
    d.release(1)
    assert propose(d, 2, prompt + [20], 3)[0] == [21, 22, 23]  # after its first token: the rest
    assert propose(d, 3, [7, 2, 3], 2) == ([], None)  # only the prompt's last 3 tokens are kept: [3 4 5]


def test_an_answers_first_draft_comes_from_the_trie_followed_further_at_the_last_opening():
    # prompts: a code block (marker 5, the code), then the same instruction / template tail 90 91 92 5;
    # every answer opens with 8 and then copies its prompt's code, or (asked again) repeats itself
    d = SuffixDrafter(depth=16, max_match=8)
    tail = [90, 91, 92, 5]

    def ask(key, code, answer, want):
        prompt = [5, 8] + code + tail
        assert propose(d, key, prompt + answer[:1], 4)[0] == want  # the opening draft
        propose(d, key, prompt + answer, 0)  # the target's tokens judge it
        d.release(key)

    ask(1, [10, 11, 12], [8, 10, 11, 12, 99], [10, 11, 12, 90])  # only its own prompt matches
    # the global trie matches "90 91 92 5 8" (5 tokens) where its own prompt matches "5 8" (2): the
    # longer match, an earlier answer, drafts first, and the target follows its own prompt instead
    ask(2, [20, 21, 22], [8, 20, 21, 22, 99], [10, 11, 12, 99])
    ask(3, [30, 31, 32], [8, 30, 31, 32, 99], [30, 31, 32, 90])  # now its own prompt first
    # the same prompts again, the same answers: its own prompt first, but the earlier answer (99 where
    # the prompt goes on with 90) is followed further, so the next opening drafts the earlier answer
    ask(4, [20, 21, 22], [8, 20, 21, 22, 99], [20, 21, 22, 90])
    ask(5, [30, 31, 32], [8, 30, 31, 32, 99], [30, 31, 32, 99])
