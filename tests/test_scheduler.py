"""The batched scheduler on a toy runner: same output alone and batched (greedy and seeded
sampling), shared forwards, per-request draft length, cancellation, the queue bound."""
import threading

import pytest

from draftwise.backends.base import equal_split_parts
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.loop_thread import LoopThread
from draftwise.sampling import SamplingParams
from draftwise.policy import FixedDraftLength
from draftwise.request import Request
from draftwise.scheduler import Scheduler
from draftwise.waiting import QueueFull
from fakes import CharTokenizer, CheapDrafter, CycleRunner

PROMPTS = [[0, 1, 2, 3, 0, 1], [5, 6, 7, 5, 6], [9, 10, 11, 12, 9, 10], [3, 4, 3]]


class Collector:
    def __init__(self):
        self.events = []
        self.done = threading.Event()

    def __call__(self, ev):
        self.events.append(ev)
        if isinstance(ev, BaseException) or ev.result is not None:
            self.done.set()

    @property
    def result(self):
        return self.events[-1].result


def run_all(sched, prompts, **kw):
    """Submit every prompt, then step the scheduler by hand until all have finished."""
    cols = []
    for p in prompts:
        c = Collector()
        sched.submit(Request(p, kw.get("max_tokens", 12), kw.get("params", SamplingParams()), c,
                             num_draft_tokens=kw.get("d")))
        cols.append(c)
    while not all(c.done.is_set() for c in cols):
        sched.step()
    return cols


def make(d=4, drafter=True, period=16, **kw):
    runner = CycleRunner(period=period)
    policy = FixedDraftLength(d, kw.pop("spec_off_above", None))
    return runner, Scheduler(runner, CharTokenizer(), NgramDrafter(1, 3) if drafter else None, policy, **kw)


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, seed=7)])
def test_same_output_alone_and_batched(params, pad):
    alone = [Engine(CycleRunner(period=16), CharTokenizer(), NgramDrafter(1, 3), 4)
             .generate(p, max_tokens=12, temperature=params.temperature, seed=params.seed).token_ids
             for p in PROMPTS]
    runner, sched = make(pad_ragged=pad)
    cols = run_all(sched, PROMPTS, params=params)
    assert [c.result.token_ids for c in cols] == alone
    assert max(len(f) for f in runner.forwards) == len(PROMPTS)  # one forward carried all of them
    assert runner.seqs == {}  # all freed
    s = cols[0].result.stats
    assert s.emitted_tokens == 12 == s.plain_steps + s.round_emitted_tokens


@pytest.mark.parametrize("pad", [False, True])
def test_mixed_draft_lengths_in_one_batch(pad):
    ds = [0, 4, 1, 3]
    alone = [Engine(CycleRunner(period=16), CharTokenizer(), NgramDrafter(1, 3), d).generate(p, max_tokens=12).token_ids
             for p, d in zip(PROMPTS, ds)]
    runner, sched = make(pad_ragged=pad)
    fed = []
    forward = runner.forward
    runner.forward = lambda s, toks, k: fed.append([len(t) for t in toks]) or forward(s, toks, k)
    cols = []
    for p, d in zip(PROMPTS, ds):
        c = Collector()
        sched.submit(Request(p, 12, SamplingParams(), c, num_draft_tokens=d))
        cols.append(c)
    while not all(c.done.is_set() for c in cols):
        sched.step()
    assert [c.result.token_ids for c in cols] == alone
    steps = [f for f in fed if len(f) > 1]
    assert steps and all(len(set(f)) == 1 for f in steps) == pad  # padded: equal k per sequence
    assert runner.seqs == {}


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, seed=7)])
def test_draft_model_drafts_every_request_in_one_forward_per_step(params):
    from draftwise.drafters.model import ModelDrafter

    def drafter():  # a draft model that agrees with the target except after token 3
        d = CycleRunner(period=16)
        after = d.logits_after
        d.logits_after = lambda t: after(t) if t != 3 else after(t + 5)
        return d

    ds = [3, 2, 0, 4]
    alone = [Engine(CycleRunner(period=16), CharTokenizer(), ModelDrafter(drafter()), d)
             .generate(p, max_tokens=12, temperature=params.temperature, seed=params.seed).token_ids
             for p, d in zip(PROMPTS, ds)]
    draft = drafter()
    sched = Scheduler(CycleRunner(period=16), CharTokenizer(), ModelDrafter(draft), FixedDraftLength(4))
    cols = []
    for p, d in zip(PROMPTS, ds):
        c = Collector()
        sched.submit(Request(p, 12, params, c, num_draft_tokens=d))
        cols.append(c)
    while not all(c.done.is_set() for c in cols):
        sched.step()
    assert [c.result.token_ids for c in cols] == alone
    assert max(len(f) for f in draft.forwards) == 3  # the three drafting requests, one draft forward
    assert sum(c.result.stats.accepted_draft_tokens for c in cols) > 0
    assert sum(c.result.stats.proposed_tokens - c.result.stats.accepted_draft_tokens for c in cols) > 0


def test_per_request_draft_length_and_load_switch():
    _, sched = make()
    off, on = run_all(sched, PROMPTS[:2], d=0)[0], run_all(sched, PROMPTS[:1], d=2)[0]
    assert off.result.stats.verification_rounds == 0 and off.result.stats.plain_steps == 12
    assert on.result.stats.proposed_per_position and len(on.result.stats.proposed_per_position) == 2
    _, sched = make(spec_off_above=2)  # 4 running > 2: speculation off while all run together
    cols = run_all(sched, PROMPTS)
    assert all(c.result.stats.verification_rounds == 0 for c in cols)


def test_cancel_frees_state_and_queue_bound():
    runner, sched = make(max_running=2, max_queue=1)
    a, b = Collector(), Collector()
    ra = Request(PROMPTS[0], 50, SamplingParams(), a)
    sched.submit(ra)
    sched.step()  # admitted and running
    sched.submit(Request(PROMPTS[1], 50, SamplingParams(), b))
    with pytest.raises(QueueFull):
        sched.submit(Request(PROMPTS[2], 50, SamplingParams(), Collector()))
    sched.step()
    assert len(runner.seqs) == 2 and sched.counts() == (0, 2)
    ra.cancel()
    sched.step()
    assert len(runner.seqs) == 1 and sched.counts() == (0, 1) and not a.done.is_set()
    with pytest.raises(ValueError, match="exceeds the context"):
        sched.submit(Request(PROMPTS[0], 600, SamplingParams(), Collector()))
    sched.close()
    assert runner.seqs == {} and isinstance(b.events[-1], RuntimeError)


def test_thread_and_failed_delivery_cancels():
    runner, sched = make()
    loop = LoopThread(sched)
    loop.start()
    c = Collector()
    sched.submit(Request(PROMPTS[0], 20, SamplingParams(), c))
    assert c.done.wait(10) and c.result.token_ids == list(range(2, 16)) and c.result.finish_reason == "stop"  # to EOS 15

    def gone(ev):
        raise RuntimeError("event loop closed")
    sched.submit(Request(PROMPTS[1], 400, SamplingParams(), gone))
    c2 = Collector()
    sched.submit(Request(PROMPTS[2], 5, SamplingParams(), c2))
    assert c2.done.wait(10) and c2.result.token_ids == [11, 12, 13, 14, 15]
    for _ in range(1000):  # the undeliverable request is dropped at the scheduler's next step
        if sched.counts() == (0, 0):
            break
        threading.Event().wait(0.01)
    assert sched.counts() == (0, 0) and runner.seqs == {}
    loop.close()


def test_planner_policy_turns_speculation_off_when_batching_makes_verification_dear():
    from draftwise.costs import CostCurve
    from draftwise.planner import Planner
    from draftwise.policy import PlannedDraftLength

    # alone, verifying k tokens costs about one forward; with 4 sequences it costs k forwards
    curve = CostCurve({1: [10, 10.5, 11, 11.5, 12], 4: [10, 20, 30, 40, 50]})
    drafter = NgramDrafter(1, 3)
    policy = PlannedDraftLength(Planner(curve, None, prior=0.9, max_draft=4, online=False, probe_max=0))
    runner = CycleRunner(period=16)
    sched = Scheduler(runner, CharTokenizer(), drafter, policy)
    alone = run_all(sched, PROMPTS[:1])[0].result.stats
    together = [c.result.stats for c in run_all(sched, PROMPTS)]
    assert alone.verification_rounds > 0
    assert all(s.verification_rounds == 0 for s in together)
    fixed = run_all(sched, PROMPTS, d=2)  # a request's own D overrides the planner
    assert all(c.result.stats.verification_rounds > 0 for c in fixed)


def test_planner_policy_prices_draft_catch_up_and_stops_drafts_early():
    from draftwise.drafters.base import StopRule
    from draftwise.drafters.model import ModelDrafter
    from draftwise.costs import CostCurve
    from draftwise.planner import Planner
    from draftwise.policy import PlannedDraftLength

    class StopAfterTwo(Planner):  # records what it is asked, and stops every draft before token 3
        def decide(self, req, step=None, index=0, available=None, unseen=1, **kw):
            asked.append(unseen)
            p = super().decide(req, step, index, available, unseen, **kw)
            if p.d > 2:
                p.stop = StopRule([0.0, 0.0] + [1.1] * (p.d - 2), [0.0, 0.0] + [1.1] * (p.d - 3))
            return p
    asked = []
    ms = [10.0 + 0.5 * k for k in range(8)]
    # a draft step costs 1 ms, but a forward of 7+ tokens 40 ms, so catching up on the 6-token
    # prompt costs 39 ms more than a step, and 2 ms more per token it falls further behind; each
    # plain step forgoes the ~7 ms a model believed right 19 times in 20 would have saved: it looks
    # while that saving, one more step's included, fits in the catch-up (CatchUp.looks), which
    # grows by 2 ms a look: seven looks (five if it stayed at 39 ms)
    pl = StopAfterTwo(CostCurve({1: ms, 4: [4 * m for m in ms]}),
                      CostCurve({1: [1.0] * 6 + [40.0 + 2 * j for j in range(30)]}),
                      prior=0.95, max_draft=6, online=False)
    drafter = ModelDrafter(CycleRunner(period=16))
    policy = PlannedDraftLength(pl)
    sched = Scheduler(CycleRunner(period=16), CharTokenizer(), drafter, policy)
    r = run_all(sched, PROMPTS[:1], max_tokens=30)[0].result
    n = len(PROMPTS[0])  # the draft model has not seen the prompt: a catch-up to price, after the
    assert asked[:8] == [n + 1 + i for i in range(8)]  # plain steps that look at the target's confidence
    assert asked[8:] == [1] * (len(asked) - 8)  # then it follows every round (each drafted)
    assert r.stats.verification_rounds >= 2 and max(p for _, p, *_ in r.rounds) == 2  # stopped at token 2 (EOS at 14)
    assert r.stats.accepted_draft_tokens == r.stats.proposed_tokens


class _Ragged(CycleRunner):
    """Splits a ragged batch as llama.cpp does with one KV stream per sequence."""
    forward_parts = staticmethod(equal_split_parts)


class _OnlyAfterA(CheapDrafter):
    """A cheap drafter that proposes the true continuation of a 15-token cycle (never the EOS
    token 15) for prompts starting with token 0 (a), and nothing for the others."""
    name = "ngram"

    def propose(self, key, ctx, n, params, gen, stop=None):
        from draftwise.drafters.base import Proposal
        return Proposal([(ctx[-1] + 1 + i) % 15 for i in range(n)] if ctx[0] == 0 else [])


def test_a_batch_prices_each_draft_by_what_it_adds_to_the_shared_step():
    """Each forward costs 10 ms plus 1 ms per token (a small model: the per-forward cost rules).
    Alone, a request whose drafts are always right drafts. In a batch of 8 whose other requests
    have nothing to draft, its draft would run as a second forward that all 8 wait for: worth
    less than that wait, so it steps plainly. When all 8 can draft, they draft together, one
    forward of equal feeds, which pays though a lone draft would not."""
    from draftwise.costs import CostCurve
    from draftwise.planner import Planner
    from draftwise.policy import PlannedDraftLength

    curve = CostCurve({b: [10 + k * b for k in range(1, 10)] for b in (1, 2, 4, 8)})
    drafter = _OnlyAfterA()
    policy = PlannedDraftLength(Planner(curve, None, prior=0.8, max_draft=4, online=False, probe_max=0,
                                        margin=0.03, risk=0.0))
    runner = _Ragged(period=15)
    sched = Scheduler(runner, CharTokenizer(), drafter, policy, max_running=8)
    a, others = [0, 1, 2], [[5 + i, 6, 7] for i in range(7)]
    assert run_all(sched, [a], max_tokens=20)[0].result.stats.verification_rounds > 0
    mixed = [c.result for c in run_all(sched, [a] + others, max_tokens=20)]
    assert all(r.stats.verification_rounds == 0 for r in mixed)
    assert mixed[0].token_ids == [(2 + i) % 15 for i in range(1, 21)]
    together = [c.result for c in run_all(sched, [[0, 1 + i, 2 + i] for i in range(8)], max_tokens=20)]
    assert all(r.stats.verification_rounds > 0 for r in together)
    padded = Scheduler(_Ragged(period=15), CharTokenizer(), drafter, policy, max_running=8, pad_ragged=True)
    assert padded._split([1, 5, 1]) == [(5, 3)]


def test_drafts_that_pay_only_together_in_a_ragged_step_give_way_to_the_plain_step():
    """T(k, b) = 10 + k b ms, alpha = 0.8, 3 of 8 requests can draft. From the alike start each
    of the 3 chooses D = 2; then, against the ragged step the others left, each keeps it: with
    it, (1 x 8) + (2 x 3) ubatches, 34 ms for 3 x 2.44 + 5 tokens; without, (1 x 8) + (2 x 2),
    32 ms for 10.88. Together they lose to the plain step, 8 tokens in 18 ms (362 against 444
    tokens/s), and none pays its extra ubatch alone (7 + 2.44 tokens in 30 ms): plain steps."""
    from draftwise.costs import CostCurve
    from draftwise.planner import Planner
    from draftwise.proposing import Batch
    from draftwise.policy import PlannedDraftLength

    curve = CostCurve({b: [10 + k * b for k in range(1, 10)] for b in (1, 2, 4, 8)})
    planner = Planner(curve, None, prior=0.8, max_draft=4, online=False, probe_max=0, margin=0.03, risk=0.0)
    planner.draft_call_s = 0.0
    drafter = _OnlyAfterA()
    policy = PlannedDraftLength(planner)
    trapped = Batch([3, 3, 3] + [1] * 5, [2.44] * 3 + [1.0] * 5, equal_split_parts)
    assert not planner.step_pays(trapped) and planner.step_pays(Batch([3] * 8, [2.44] * 8, equal_split_parts))
    sched = Scheduler(_Ragged(period=15), CharTokenizer(), drafter, policy, max_running=8)
    prompts = [[0, 1 + i, 2 + i] for i in range(3)] + [[5 + i, 6, 7] for i in range(5)]
    out = [c.result for c in run_all(sched, prompts, max_tokens=12)]
    assert all(r.stats.verification_rounds == 0 for r in out)
    assert [r.token_ids for r in out[:3]] == [[(2 + i + j) % 15 for j in range(1, 13)] for i in range(3)]
