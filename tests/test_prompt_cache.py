"""The prompt cache: which entry a prompt reuses and how much, eviction, and the loop prefilling
only what the cache does not hold, with outputs equal to uncached runs."""
import pytest
import torch

from draftwise.backends.base import KVState, padded_parts
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.prompt_cache import PromptCache
from fakes import CharTokenizer, CycleRunner

PROMPT = [0, 1, 2, 3, 4, 0, 1]


def state(n, nbytes=None):
    return KVState(n, 64 * n if nbytes is None else nbytes, None)


def test_lookup_reuses_the_longest_shared_prefix():
    c = PromptCache(1 << 20)
    logits = torch.arange(4.0)[None]
    c.store([1, 2, 3, 4], state(4), logits)
    c.store([1, 2, 9], state(3), logits)
    assert c.lookup([7, 8]) is None  # nothing shared
    hit = c.lookup([1, 2, 3, 4])  # the whole prompt: its logits come with it
    assert hit.reuse == 4 and torch.equal(hit.logits, logits) and hit.state.n == 4
    hit = c.lookup([1, 2, 3, 4, 5, 6])  # an entry that is a prefix: reused whole, the rest prefilled
    assert hit.reuse == 4 and hit.logits is None
    hit = c.lookup([1, 2, 3])  # a prefix of an entry: one token is forwarded for the logits
    assert hit.reuse == 2 and hit.logits is None and hit.state.n == 4
    assert c.lookup([1, 5]).reuse == 1  # both entries share one token: either serves
    assert c.lookup([1]) is None  # the only shared token must be forwarded for its logits
    assert (c.hits, c.lookups, c.reused_tokens) == (4, 6, 11)


def test_eviction_keeps_the_recently_used_within_the_cap():
    c = PromptCache(300)
    z = torch.zeros(1, 2)  # a logits row of 8 bytes, counted with its entry
    c.store([1], state(1, 92), z)
    c.store([2], state(1, 92), z)
    c.store([3], state(1, 92), z)
    assert c.bytes == 300
    assert c.lookup([1, 5]) is not None  # [1] is now the most recently used
    c.store([4], state(1, 142), z)  # evicts [2] and [3], the least recently used
    assert len(c) == 2 and c.bytes == 250
    assert c.lookup([2, 5]) is None and c.lookup([3, 5]) is None and c.lookup([1, 5]) is not None
    c.store([4], state(1, 42), z)  # the same prompt again replaces its entry
    assert len(c) == 2 and c.bytes == 150
    c.store([5], state(1, 293), z)  # larger than the whole cache: not kept, nothing evicted
    assert len(c) == 2 and c.bytes == 150 and [5] not in c and [4] in c
    with pytest.raises(ValueError, match="prompt cache's size"):
        PromptCache(-1)


def test_a_prompt_asked_again_finds_its_own_entry_before_a_longer_one():
    c = PromptCache(1 << 20)
    z = torch.ones(1, 3)
    c.store([1, 2, 3, 4, 5], state(5), z)
    c.store([1, 2, 3], state(3), z * 2)
    c.store([5, 6], state(2), z)
    assert c.lookup([1, 2, 9]).reuse == 2  # a tie between the first two: either may serve
    hit = c.lookup([1, 2, 3])  # the whole prompt is an entry: reused whole, with its logits
    assert hit.reuse == 3 and torch.equal(hit.logits, z * 2)
    c.store([5], state(1), z * 3)
    assert torch.equal(c.lookup([5]).logits, z * 3)  # a one-token prompt matched by its own entry


def counting_runner():
    runner = CycleRunner()
    fed, forward = [], runner.forward  # tokens fed per forward call
    runner.forward = lambda seqs, toks, ks, *a: fed.append(sum(map(len, toks))) or forward(seqs, toks, ks, *a)
    return runner, fed


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_loop_prefills_only_what_the_cache_lacks(temperature):
    def fresh(prompt):
        return Engine(CycleRunner(), CharTokenizer(), NgramDrafter(1, 3), 4).generate(
            prompt, max_tokens=10, temperature=temperature, seed=3)

    runner, fed = counting_runner()
    eng = Engine(runner, CharTokenizer(), NgramDrafter(1, 3), 4, prompt_cache_bytes=1 << 20)
    first = eng.generate(PROMPT, max_tokens=10, temperature=temperature, seed=3)
    assert fed[0] == len(PROMPT) and first.stats.cached_tokens == 0 and runner.seqs == {}
    n = len(fed)
    again = eng.generate(PROMPT, max_tokens=10, temperature=temperature, seed=3)
    assert again.token_ids == first.token_ids == fresh(PROMPT).token_ids
    assert again.stats.cached_tokens == len(PROMPT) and max(fed[n:]) <= 1 + 4  # no prompt forward
    longer = PROMPT + [2, 3, 4, 0]
    n = len(fed)
    grown = eng.generate(longer, max_tokens=10, temperature=temperature, seed=3)
    assert grown.stats.cached_tokens == len(PROMPT) and fed[n] == 4  # only the new tokens
    assert grown.token_ids == fresh(longer).token_ids
    assert len(eng.scheduler.prompt_cache) == 2 and runner.seqs == {}  # copies, no sequence held


def test_a_prompt_cache_needs_a_runner_that_saves():
    class NoSave:  # what the scheduler reads of a runner at construction
        backend, n_seq_max, trees, saves, vocab_size, max_context = "fake", None, False, False, 16, 512
        forward_parts = staticmethod(padded_parts)

    with pytest.raises(ValueError, match="cannot save a sequence's KV state"):
        Engine(NoSave(), CharTokenizer(), prompt_cache_bytes=1 << 20)
    Engine(NoSave(), CharTokenizer())  # without a cache it is not asked to


def test_a_private_request_neither_reads_nor_adds_entries():
    runner, fed = counting_runner()
    eng = Engine(runner, CharTokenizer(), NgramDrafter(1, 3), 4, prompt_cache_bytes=1 << 20)
    eng.generate(PROMPT, max_tokens=4, private=True)
    assert len(eng.scheduler.prompt_cache) == 0
    eng.generate(PROMPT, max_tokens=4)
    n = len(fed)
    r = eng.generate(PROMPT, max_tokens=4, private=True)
    assert r.stats.cached_tokens == 0 and fed[n] == len(PROMPT)  # prefilled although an entry exists
    assert eng.scheduler.prompt_cache.lookups == 1  # the shared request looked, the private ones did not


def test_a_state_that_cannot_be_restored_is_dropped_and_the_prompt_prefilled():
    runner, fed = counting_runner()
    eng = Engine(runner, CharTokenizer(), NgramDrafter(1, 3), 4, prompt_cache_bytes=1 << 20)
    ref = eng.generate(PROMPT, max_tokens=6)

    def broken(s, state):
        raise RuntimeError("no memory for the copy")
    runner.restore = broken
    n = len(fed)
    again = eng.generate(PROMPT, max_tokens=6)
    assert again.token_ids == ref.token_ids and again.stats.cached_tokens == 0 and fed[n] == len(PROMPT)
    assert PROMPT in eng.scheduler.prompt_cache and runner.seqs == {}  # stored anew from this request
    assert not eng.scheduler.sequences_held
