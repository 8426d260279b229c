"""The loop's failure boundaries, on the toy runner: a request that fails (its seed, its forward,
its commit, its draft) fails alone, frees its sequence, and the others finish token-identical to a
run without it; a failed batched forward is retried per sequence; a loop-level fault fails the
running after MAX_LOOP_ERRORS; drain; the context check's reservation; /health's heartbeat."""
import threading
import time

import pytest

from draftwise.costs import CostCurve
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.planner import Planner
from draftwise.policy import FixedDraftLength, PlannedDraftLength
from draftwise.sampling import SamplingParams
from draftwise.loop_thread import MAX_LOOP_ERRORS, LoopThread
from draftwise.observer import NullObserver
from draftwise.request import Request
from draftwise.scheduler import Scheduler
from draftwise.server.lifecycle import Lifecycle
from draftwise.waiting import ShuttingDown
from fakes import CharTokenizer
from serving import Runner

PROMPTS = [[0, 1, 2, 3, 0, 1], [5, 6, 7, 5, 6], [3, 4, 3]]
GREEDY, SEEDED = SamplingParams(), SamplingParams(temperature=1.0, seed=7)


def once_batched():
    """A fault that makes the first forward of more than one sequence raise."""
    seen = []

    def fail(seqs, toks):
        if len(seqs) > 1 and not seen:
            seen.append(seqs)
            return True
        return False
    return fail


class Faults(NullObserver):
    def __init__(self):
        self.kinds = []

    def fault(self, kind):
        self.kinds.append(kind)


class Events(list):
    def __call__(self, ev):
        self.append(ev)

    @property
    def done(self):
        return bool(self) and (isinstance(self[-1], BaseException) or self[-1].result is not None)

    @property
    def ids(self):
        return self[-1].result.token_ids


def run(sched, specs, max_tokens=12):
    """Submit (prompt, params) pairs, step until all are done; their event lists."""
    evs = []
    for prompt, params in specs:
        evs.append(Events())
        sched.submit(Request(prompt, max_tokens, params, evs[-1]))
    while not all(e.done for e in evs):
        sched.step()
    return evs


def scheduler(runner=None, drafter=None, d=4, **kw):
    return Scheduler(runner or Runner(), CharTokenizer(), drafter or NgramDrafter(1, 3), FixedDraftLength(d), **kw)


GOOD = [(PROMPTS[0], GREEDY), (PROMPTS[1], SEEDED)]
ALONE = [run(scheduler(), [g])[0].ids for g in GOOD]


def test_seed_overflow_fails_alone_and_leaks_no_slot():
    runner = Runner(n_seq_max=3)
    sched = scheduler(runner, max_running=3)
    bad = (PROMPTS[2], SamplingParams(temperature=1.0, seed=2 ** 64))  # torch: "Overflow when unpacking long long"
    evs = run(sched, [GOOD[0], bad, GOOD[1]] + [bad] * 5)
    assert [evs[0].ids, evs[2].ids] == ALONE
    assert all(len(e) == 1 and isinstance(e[0], (OverflowError, RuntimeError, ValueError)) for e in [evs[1]] + evs[3:])
    assert runner.seqs == {} and sched.sequences_held == 0 and sched.counts() == (0, 0)
    assert [e.ids for e in run(sched, GOOD)] == ALONE  # every slot is still there


class Timed(FixedDraftLength):
    def __init__(self, d):
        super().__init__(d)
        self.steps = []

    def observe(self, step):
        self.steps.append(step)


def test_step_overhead_leaves_out_the_work_per_emitted_token():
    """Text, logprobs and delivery are done per emitted token, for plain decoding too: the
    per-step overhead the planner learns (StepTimes.other_s) leaves them out, or a drafting step's
    many tokens would make a plain step look dearer than it is."""
    sched = Scheduler(Runner(), CharTokenizer(), NgramDrafter(1, 3), policy := Timed(4))
    commit = sched._commit

    def slow_commit(*a, **kw):
        time.sleep(0.02)
        return commit(*a, **kw)
    sched._commit = slow_commit
    run(sched, GOOD)
    assert policy.steps and all(s.other_s < 0.02 for s in policy.steps)


def test_batched_forward_failure_is_retried_alone():
    clean = Scheduler(Runner(), CharTokenizer(), NgramDrafter(1, 3), policy := Timed(4))
    run(clean, GOOD)
    runner = Runner(fail=once_batched())
    sched = Scheduler(runner, CharTokenizer(), NgramDrafter(1, 3), faulted := Timed(4), observer=(obs := Faults()))
    evs = run(sched, GOOD)
    assert [e.ids for e in evs] == ALONE and obs.kinds == ["forward"]
    assert len(faulted.steps) == len(policy.steps) - 1  # the step of retries does not price the batched forward
    assert runner.seqs == {}


def test_a_request_whose_forward_fails_fails_alone():
    # the second request's sequence (id 2) fails every forward after its prefill
    runner = Runner(fail=lambda seqs, toks: 2 in seqs and len(runner.seqs[2]) > 0)
    sched = scheduler(runner, observer=(obs := Faults()))
    evs = run(sched, [GOOD[0], (PROMPTS[2], GREEDY), GOOD[1]])
    assert [evs[0].ids, evs[2].ids] == ALONE
    assert isinstance(evs[1][-1], RuntimeError) and evs[1][0].result is None  # its first token, then the error
    assert "forward" in obs.kinds and runner.seqs == {}


def test_a_failing_commit_fails_only_its_request():
    class Picky(CharTokenizer):  # cannot decode token 14, which only PROMPTS[1]'s output (7, 8, ...) reaches
        def decode(self, ids):
            if 14 in ids:
                raise UnicodeDecodeError("utf-8", b"", 0, 1, "injected")
            return super().decode(ids)
    sched = Scheduler(Runner(), Picky(), NgramDrafter(1, 3), FixedDraftLength(4))
    evs = run(sched, [(PROMPTS[0], GREEDY), (PROMPTS[1], GREEDY), (PROMPTS[2], GREEDY)], max_tokens=10)
    assert isinstance(evs[1][-1], UnicodeDecodeError)
    assert [evs[0].ids, evs[2].ids] == [run(scheduler(), [(p, GREEDY)], 10)[0].ids for p in (PROMPTS[0], PROMPTS[2])]
    assert sched.sequences_held == 0


def test_a_failed_draft_model_batch_is_retried_alone():
    alone = [run(scheduler(drafter=ModelDrafter(Runner())), [g])[0].ids for g in GOOD]
    sched = scheduler(drafter=ModelDrafter(Runner(fail=once_batched())), observer=(obs := Faults()))
    evs = run(sched, GOOD)
    assert [e.ids for e in evs] == alone and obs.kinds == ["draft"]
    assert sum(e[-1].result.stats.accepted_draft_tokens for e in evs) > 0


def test_loop_faults_fail_the_running_after_a_few_and_the_loop_lives_on():
    class Broken(Faults):
        broken = True

        def queue(self, waiting, running):  # called outside every request's boundary
            if self.broken:
                raise RuntimeError("observer bug")
    sched = scheduler(observer=(obs := Broken()))
    loop = LoopThread(sched)
    loop.start()
    ev = Events()
    sched.submit(Request(PROMPTS[0], 50, GREEDY, ev))
    deadline = time.time() + 10
    while not ev.done and time.time() < deadline:
        time.sleep(0.01)
    assert isinstance(ev[-1], RuntimeError) and obs.kinds == ["loop"] * MAX_LOOP_ERRORS
    obs.broken = False
    ok = Events()
    sched.submit(Request(PROMPTS[0], 12, GREEDY, ok))
    while not ok.done and time.time() < deadline:
        time.sleep(0.01)
    assert ok.ids == ALONE[0] and loop.alive() and sched.sequences_held == 0
    loop.close()


def test_drain_finishes_in_flight_then_cancels_the_rest():
    runner = Runner(delay=0.01, period=15)  # no EOS (token 15): the long request runs to max_tokens
    sched = scheduler(runner)
    loop = LoopThread(sched)
    loop.start()
    short, long = Events(), Events()
    sched.submit(Request(PROMPTS[0], 12, GREEDY, short))
    sched.submit(Request(PROMPTS[1], 500, GREEDY, long))
    t = threading.Thread(target=loop.drain, args=(0.3,))
    t.start()
    time.sleep(0.05)
    with pytest.raises(ShuttingDown):
        sched.submit(Request(PROMPTS[2], 4, GREEDY, Events()))
    t.join(5)
    assert len(short.ids) == 12  # finished within the drain
    assert isinstance(long[-1], ShuttingDown) and long[-2].result is None  # cut off at the deadline
    assert runner.seqs == {} and not loop.alive()


@pytest.mark.parametrize("drafter", ["ngram", "model", "auto"])
def test_the_context_needs_no_draft_reserve(drafter):
    """A round never drafts past max_tokens, so prompt + max_tokens = the context runs to the end
    with D = 8 (or auto's max_draft 16) and the runner never holds a token past its context."""
    prompt = [0, 1, 2, 3] * 6  # the target repeats it (period 4): every n-gram draft is full length
    runner = Runner(max_context=len(prompt) + 40, period=4)
    if drafter == "auto":
        planner = Planner(CostCurve({1: [10.0 + 0.1 * k for k in range(18)]}), None, prior=0.99, online=False,
                          probe_max=0)
        sched = Scheduler(runner, CharTokenizer(), d := NgramDrafter(1, 3), PlannedDraftLength(planner),
                          reserve_draft=False)
        assert sched.max_draft == 16
    else:
        d = ModelDrafter(Runner(max_context=len(prompt) + 40, period=4)) if drafter == "model" else NgramDrafter(1, 3)
        sched = Scheduler(runner, CharTokenizer(), d, FixedDraftLength(8), reserve_draft=False)
    with pytest.raises(ValueError, match="exceeds the context"):
        sched.check(prompt, 41)
    ev = run(sched, [(prompt, GREEDY)], max_tokens=40)[0]
    assert len(ev.ids) == 40 and ev[-1].result.stats.accepted_draft_tokens >= 20
    assert sched.reserve == 0 and scheduler(d=8).reserve == 8  # the other commands keep the conservative check


def test_health_reports_a_dead_or_stuck_loop():
    gate = threading.Event()
    runner = Runner()
    forward = runner.forward
    runner.forward = lambda *a: (gate.wait(10), forward(*a))[1]
    sched = scheduler(runner)
    life = Lifecycle(lambda: (sched, None), stall_timeout=0.05)
    assert life.health() == (503, {"status": "loading"})
    life.start()
    assert life.wait(5) and life.health()[0] == 200
    sched.submit(Request(PROMPTS[0], 4, GREEDY, ev := Events()))
    time.sleep(0.2)
    status, body = life.health()
    assert status == 503 and body["status"] == "unhealthy" and "stall timeout" in body["reason"]
    gate.set()
    while not ev.done:
        time.sleep(0.01)
    assert life.health()[0] == 200
    life.loop.close()
    assert life.health()[1]["reason"] == "the scheduler's loop thread has stopped"
