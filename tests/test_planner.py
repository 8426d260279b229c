"""The draft-length planner on synthetic cost curves, its online updates, and `auto` in the engine."""
import numpy as np
import pytest

from draftwise.acceptance import Acceptance, Calibration
from draftwise.costs import CostCurve
from draftwise.drafters.base import StopRule
from draftwise.drafters.model import ModelDrafter
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.catch_up import CatchUp
from draftwise.draft_length import Decision, best_draft_length, expected_tokens, gains_of
from draftwise.planner import Planner, RoundRecord
from draftwise.proposing import Batch
from draftwise.profile import ProfileResult
from draftwise.sampling import SamplingParams
from fakes import CharTokenizer, CycleRunner

K = 17


@pytest.fixture
def no_looks(monkeypatch):
    """The draft model's rent-or-buy wait before its first catch-up, off (CatchUp.looks)."""
    monkeypatch.setattr(CatchUp, "looks", staticmethod(lambda req, seconds, plain_rate: False))


def curve(per_token_ms, first_ms=10.0, batch=(1,)):
    """ms(k) = first + per_token * (k - 1), for k = 1..K."""
    return CostCurve({b: [b * first_ms + b * per_token_ms * (k - 1) for k in range(1, K + 1)] for b in batch})


def planner(per_token_ms, prior, draft=None, **kw):
    return Planner(curve(per_token_ms), draft, prior=prior, max_draft=16, **kw)


def test_expected_tokens_by_hand():
    a = np.array([0.5, 0.5, 1.0])
    assert expected_tokens(a, 0) == 1.0
    assert expected_tokens(a, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(a, 3) == pytest.approx(1.75 + 0.25)


def test_plain_when_drafting_cannot_pay():
    # verifying k tokens costs k plain steps: no acceptance below 1 can pay for a draft
    pl = planner(per_token_ms=10.0, prior=0.9)
    assert pl.decide(pl.new_request(100)).d == 0
    # cheap verification, but the draft model costs as much as the target per token
    pl = planner(per_token_ms=0.5, prior=0.5, draft=curve(10.0, first_ms=10.0))
    assert pl.decide(pl.new_request(100)).d == 0


def test_long_draft_when_acceptance_high_and_verify_cheap():
    pl = planner(per_token_ms=0.1, prior=0.98)
    p = pl.decide(pl.new_request(100))
    assert p.d == 16 and p.rate > 5 * p.plain_rate
    # the room left caps D: a round always emits one token besides the accepted ones
    assert pl.decide(pl.new_request(5)).d == 4


def test_moderate_cost_picks_an_interior_d():
    # alpha = 0.7: E[N](d) saturates at ~3.3 while cost keeps growing by 30% of a step per token
    pl = planner(per_token_ms=3.0, prior=0.7, probe_max=0)  # exploitation only: the estimate's optimum
    d = pl.decide(pl.new_request(100)).d
    rates = pl.predicted_speedup(np.full(16, 0.7))
    assert 1 <= d <= 8 and d == max(rates, key=rates.get)


def test_moves_between_plain_and_long_drafts_when_acceptance_changes():
    pl = planner(per_token_ms=2.0, prior=0.6)
    req = pl.new_request(10_000)
    chosen = []
    for phase in (16, 0, 16):  # full acceptance, then every draft rejected at once, then full again
        for _ in range(40):
            plan = pl.decide(req)
            chosen.append(plan.d)
            if plan.d:
                pl.learn(req, plan, RoundRecord(plan.d, min(phase, plan.d), min(phase, plan.d) + 1))
            else:  # a plain step: a cheap drafter's unverified first token is still scored
                pl.learn(req, plan, RoundRecord(0, 0, 1))
                pl.shadow(req, 1.0 if phase else 0.0)
    assert chosen[39] >= 10 and chosen[79] == 0 and chosen[119] >= 10
    assert 0 in chosen[40:60] and max(chosen[80:95]) >= 8  # reacts within rounds each way


def test_acceptance_counts_reached_positions_only():
    acc = Acceptance(np.full(4, 0.5), strength=2.0, forget=1.0)  # no forgetting: plain counts
    acc.observe(proposed=4, accepted=1)  # position 1 accepted, 2 rejected, 3 and 4 never reached
    assert acc.seen.tolist() == [1, 1, 0, 0] and acc.acc.tolist() == [1, 0, 0, 0]
    a = acc.alpha()  # position i borrows half its prior mean from position i-1
    # m_2 = 0.5 / 4 + 3/4 * 2/3 = 0.625, alpha_2 = 2 * m_2 / 3; m_3 = 0.125 + 3/4 * alpha_2, ...
    assert a.tolist() == pytest.approx([2 / 3, 5 / 12, 0.4375, 0.453125])
    acc.observe(proposed=2, accepted=2)  # all accepted: nothing rejected
    assert acc.seen.tolist() == [2, 2, 0, 0] and acc.acc.tolist() == [2, 1, 0, 0]
    acc.observe(proposed=1, accepted=1, after=0.25)  # the drafter stopped before token 2 (p 0.25)
    assert acc.seen.tolist() == [3, 3, 0, 0] and acc.acc.tolist() == [3, 1.25, 0, 0]
    acc.observe(proposed=2, accepted=0, after=0.9)  # token 1 rejected: the dropped token says nothing
    assert acc.seen.tolist() == [4, 3, 0, 0] and acc.acc.tolist() == [3, 1.25, 0, 0]


def test_an_unverified_draft_is_judged_against_the_greedy_tokens_as_far_as_they_go():
    pl = planner(1.0, prior=0.5)
    req = pl.new_request(100)
    acc = req.acceptance
    acc.forget = 1.0  # no discount: plain counts
    seen, got = acc.seen.copy(), acc.acc.copy()
    pl.counterfactual(req, [1, 2, 3, 4], [1, 2, 9])  # rejected at its 3rd token
    assert (acc.seen - seen)[:4].tolist() == [1, 1, 1, 0] and (acc.acc - got)[:4].tolist() == [1, 1, 0, 0]
    seen, got = acc.seen.copy(), acc.acc.copy()
    pl.counterfactual(req, [1, 2, 3, 4], [1, 2])  # right as far as the target went: nothing past it
    assert (acc.seen - seen)[:4].tolist() == [1, 1, 0, 0] and (acc.acc - got)[:4].tolist() == [1, 1, 0, 0]
    seen = acc.seen.copy()
    pl.counterfactual(req, [], [1, 2])  # nothing proposed: nothing learnt
    assert (acc.seen == seen).all()


def test_online_update_rescales_curve_and_tracks_overhead():
    pl = planner(per_token_ms=1.0, prior=0.6)
    before = pl.target(5)
    for _ in range(200):  # the machine got twice as slow
        pl.observe_times(5, 1, 2 * pl.target.raw(5), draft_forwards=4, unseen=1, draft_s=0.002, overhead_s=0.003)
    assert pl.target(5) == pytest.approx(2 * before, rel=1e-3)
    assert pl.target(1) == pytest.approx(2 * pl.target.raw(1), rel=1e-3)  # the whole curve follows
    assert pl.overhead_s == pytest.approx(0.003, rel=1e-3) and pl.draft_call_s == pytest.approx(0.002, rel=1e-3)
    for _ in range(200):  # then k = 2 runs at its profile while k = 5 stays at twice it
        pl.observe_times(2, 1, pl.target.raw(2), draft_forwards=1, unseen=1, draft_s=0.002, overhead_s=0.003)
        pl.observe_times(5, 1, 2 * pl.target.raw(5), draft_forwards=4, unseen=1, draft_s=0.002, overhead_s=0.003)
    # each k observed keeps its own (within the slight pull of the whole curve, 1.5x here)
    assert pl.target(2) == pytest.approx(pl.target.raw(2), rel=0.03)
    assert pl.target(5) == pytest.approx(2 * pl.target.raw(5), rel=0.03)
    pl.observe_times(2, 1, 50 * pl.target.raw(2), draft_forwards=1, unseen=1, draft_s=0.002, overhead_s=0.003)
    assert pl.target(2) < 1.15 * pl.target.raw(2)  # one stall (50x) moves a point by 10% at most
    assert 1.3 < pl.target(9) / pl.target.raw(9) < 1.7  # a k never observed follows the multi-token forwards
    frozen = planner(per_token_ms=1.0, prior=0.6, online=False)
    frozen.observe_times(5, 1, 1.0, draft_forwards=4, unseen=1, draft_s=1.0, overhead_s=1.0)
    assert frozen.target(5) == frozen.target.raw(5) and frozen.overhead_s == 0.0


def test_multi_token_forwards_keep_their_correction_among_many_plain_steps():
    # a running engine whose plain steps run at the profile and whose rounds, of any k, run 1.2x it
    # (the profile measured at a shorter context): ten plain steps per round, each round's k new
    c = CostCurve({1: [10.0 + 2.0 * k for k in range(17)]})
    for i in range(300):
        for _ in range(10):
            c.observe(1, 1, c.raw(1))
        k = 2 + i % 15
        c.observe(k, 1, 1.2 * c.raw(k))
    assert c.scale < 1.03  # the whole curve is what plain steps say
    assert c(1) == pytest.approx(c.raw(1), rel=0.01)
    for k in (2, 9, 16, 17, 30):  # every multi-token point, observed a while ago or never, says 1.2x
        assert c(k) / c.raw(k) == pytest.approx(1.2, rel=0.02)


def test_draft_model_catch_up_counts_against_remaining_output(no_looks):
    draft = curve(per_token_ms=1.0, first_ms=2.0)  # a catch-up of 200 tokens costs ~200 ms
    pl = planner(per_token_ms=0.5, prior=0.9, draft=draft, )
    assert pl.decide(pl.new_request(400), unseen=1).d > 0
    assert pl.decide(pl.new_request(400), unseen=200).d > 0  # 400 tokens left: pays off
    assert pl.decide(pl.new_request(6), unseen=200).d == 0  # 6 tokens left: cannot


def test_early_stop_bars_weigh_keeping_a_token_and_the_rest_of_the_plan():
    pl = planner(per_token_ms=2.0, prior=0.9, draft=curve(1.0, first_ms=1.0))
    p = pl.decide(pl.new_request(100))
    assert p.d > 1 and len(p.stop.keep) == p.d and len(p.stop.go_on) == p.d - 1
    # linear curves: token j's forward is paid when its probability c_j is read; keeping it costs
    # one verify step (2 ms) for reach_{j-1} * c_j tokens; drafting on to d costs d - j draft
    # steps (1 ms) and d - j verify steps for reach_{j-1} * c_j * (alpha + alpha^2 + ...) tokens
    alpha = pl.new_request(100).acceptance.alpha()
    reach = np.concatenate([[1.0], np.cumprod(alpha)])
    for j in range(1, p.d + 1):
        assert p.stop.keep[j - 1] == pytest.approx(p.rate * 0.002 / reach[j - 1])
    for j in range(1, p.d):
        tail = np.cumprod(alpha[j:p.d]).sum()
        want = p.rate * (p.d - j) * (0.001 + 0.002) / (reach[j - 1] * tail)
        assert p.stop.go_on[j - 1] == pytest.approx(want)
    # a non-convex curve (flat past k = 9, as llama.cpp's): the bar at k = 5..8 counts the
    # nearly free tokens after it, so it is lower than the marginal cost alone would set
    ms = [100, 130, 160, 190, 225, 250, 280, 296, 290, 295, 300, 300, 305, 307, 313, 314, 429]
    flat = Planner(CostCurve({1: ms}), curve(0.5, first_ms=1.0), prior=0.98, max_draft=16)
    q = flat.decide(flat.new_request(100))
    assert q.d >= 12 and max(q.stop.go_on[4:8]) < 0.5


def test_draft_probabilities_calibrated_by_measured_acceptance():
    pl = planner(per_token_ms=2.0, prior=0.9, draft=curve(1.0, first_ms=1.0))
    req = pl.new_request(100_000)
    before = pl.decide(req).stop.go_on
    for _ in range(200):  # the draft says 0.5 for tokens the target always accepts
        pl.learn(req, pl.decide(req), RoundRecord(4, 4, 5, [0.5] * 4))
    assert pl.calib.scale == pytest.approx(2.0, abs=0.01)  # measured 4 / (4 x 0.5)
    assert pl.calib(0.55) == pytest.approx(1.0, abs=0.01)  # the centre of the bin holding 0.5
    after = pl.decide(req)
    assert after.stop.go_on[0] < before[0]


def test_batch_sizes_interpolate_and_extrapolate():
    c = CostCurve({1: [10.0, 12.0], 4: [40.0, 48.0]})
    assert c(1, 2) == pytest.approx(0.020) and c(2, 2) == pytest.approx(0.024)
    assert c(1, 8) == pytest.approx(0.080)  # past the largest b: extends the 1 -> 4 segment
    assert c(3, 1) == pytest.approx(0.014)  # past the largest k: the mean step over the measured range
    assert CostCurve({1: [10.0, 30.0, 20.0]})(5) == pytest.approx(0.030)  # never a falling extension


def test_curve_from_profile_requires_every_k():
    rows = [{"batch": 1, "k": k, "ms_median": float(k), "ms_all": []} for k in (1, 2, 4)]
    with pytest.raises(ValueError, match="without gaps"):
        CostCurve.from_profile(ProfileResult(rows, 8, "fake", 1, 0))


PROMPT = [0, 1, 2, 3, 4, 0, 1]


def test_auto_greedy_equals_plain_and_speculates_when_it_pays():
    plain = Engine(CycleRunner(), CharTokenizer()).generate(PROMPT, max_tokens=40)
    pl = planner(per_token_ms=0.2, prior=0.5)
    eng = Engine(CycleRunner(), CharTokenizer(), NgramDrafter(1, 3), "auto", planner=pl)
    r = eng.generate(PROMPT, max_tokens=40)
    assert r.token_ids == plain.token_ids
    assert r.stats.verification_rounds > 0 and r.stats.acceptance_rate == 1.0
    assert max(p for _, p, *_ in r.rounds) > 4  # it learnt that long drafts pay here


def test_auto_does_not_feed_draft_model_while_plain():
    draft_runner = CycleRunner()
    pl = planner(per_token_ms=10.0, prior=0.9, draft=curve(10.0), online=False)  # drafting never pays
    eng = Engine(CycleRunner(), CharTokenizer(), ModelDrafter(draft_runner), "auto", planner=pl)
    r = eng.generate(PROMPT, max_tokens=20)
    assert r.stats.verification_rounds == 0 and r.stats.plain_steps == 20
    assert draft_runner.forwards == []  # never fed, not even the prompt


def test_model_drafter_early_stop():
    class Unsure(CycleRunner):  # right next token, but with low confidence
        def logits_after(self, t):
            row = super().logits_after(t)
            row[(t + 2) % self.period] = self.sharp - 0.5
            return row
    dr = ModelDrafter(Unsure(sharp=2.0))
    params = SamplingParams(0.0)
    full = dr.propose(1, PROMPT, 6, params, None)
    assert len(full.tokens) == 6 and (full.forwards, full.stop_confidence) == (6, None)
    conf = float(np.exp(2.0) / (np.exp(2.0) + np.exp(1.5) + 14))  # softmax of the top token, ~0.39
    lo, hi = conf * 0.99, conf * 1.01
    # token 3 falls below its bar to go on: kept, no forward for token 4
    kept = dr.propose(2, PROMPT, 6, params, None, StopRule([lo] * 6, [lo, lo, hi, lo, lo]))
    assert kept.tokens == full.tokens[:3] and kept.forwards == 3
    assert kept.confidence == pytest.approx([conf] * 3) and kept.stop_confidence == pytest.approx(conf)
    # drafting stops at token 3, which falls below its bar to be kept: dropped (its forward was run)
    dropped = dr.propose(3, PROMPT, 6, params, None, StopRule([lo, lo, hi, lo, lo, lo], [lo, lo, hi, lo, lo]))
    assert dropped.tokens == full.tokens[:2] and dropped.forwards == 3
    assert dropped.stop_confidence == pytest.approx(conf)
    # the keep bar is read only where drafting stops: token 3 below it but above its go-on bar
    # is drafted on from (a non-convex verify curve: a token that cannot pay alone can as the
    # start of a longer draft), and the last token, where drafting stops anyway, is dropped
    on = dr.propose(4, PROMPT, 6, params, None, StopRule([lo, lo, hi, lo, lo, hi], [lo] * 5))
    assert on.tokens == full.tokens[:5] and on.forwards == 6 and on.stop_confidence == pytest.approx(conf)


def test_a_confident_draft_runs_the_plan_where_its_first_token_alone_cannot_pay():
    """torch on the AMD EPYC: verifying 2 tokens cost 2.35 plain steps, 16 tokens 2.5. A plan of
    15 pays; its first token alone never does (keep bar > 1). The draft must still be drafted in
    full, not dropped at its first token every step (v13: 0.72x plain on EditEval)."""
    ms = [355, 833, 1010, 767, 750, 759, 874, 751, 862, 885, 1313, 864, 885, 874, 935, 886, 988]
    pl = Planner(CostCurve({1: ms}), curve(10.0, first_ms=10.0), prior=0.98, max_draft=16, online=False)
    p = pl.decide(pl.new_request(100))
    assert p.d >= 8 and p.stop.keep[0] > 1.0  # a lone first token cannot be kept
    dr = ModelDrafter(CycleRunner())  # confident: its own p of each token ~0.99
    prop = dr.propose(1, PROMPT, p.d, SamplingParams(0.0), None, p.stop)
    assert len(prop.tokens) >= p.d - 1 and prop.tokens == dr.propose(2, PROMPT, len(prop.tokens), SamplingParams(0.0), None).tokens


def test_early_stopped_round_charges_the_dropped_tokens_forward():
    class StopAfterTwo(Planner):  # every plan stops the draft before its third token
        def decide(self, req, *a, **kw):
            p = super().decide(req, *a, **kw)
            if p.d > 2:  # keep tokens 1, 2, stop at token 3 and drop it
                p.stop = StopRule([0.0, 0.0] + [1.1] * (p.d - 2), [0.0, 0.0] + [1.1] * (p.d - 3))
            return p

        def observe_times(self, k, n, forward_s, draft_forwards, *a, **kw):
            seen.append(draft_forwards)

        def finish(self, req, length=None):
            finished.append((req.remaining, length))
    seen, finished = [], []
    draft_runner = CycleRunner()
    pl = StopAfterTwo(curve(1.0), curve(0.1, first_ms=0.1), prior=0.95, max_draft=8, online=False)
    r = Engine(CycleRunner(), CharTokenizer(), ModelDrafter(draft_runner), "auto", planner=pl).generate(PROMPT, max_tokens=30)
    proposed = [p for _, p, *_ in r.rounds]
    assert r.stats.verification_rounds > 5 and set(proposed[:-1]) == {2}  # the last is cut by max_tokens
    # an early-stopped round ran 3 draft forwards (catch-up, then tokens 1 and 2 fed, the last one
    # giving the dropped token 3) and is charged 3; the last round (1 token, no stop) is charged 1
    assert [d for d in seen if d] == [3] * (len(proposed) - 1) + [proposed[-1]]
    assert sum(seen) == len(draft_runner.forwards)
    # the engine tells the planner the request ended, and its 29 tokens after the prefill's (its cap)
    assert finished == [(0, 29)]


def test_predicted_times_count_the_tokens_emitted_not_the_plans_expectation():
    class StopAfterOne(Planner):  # plans long drafts, every one stopped after its first token
        def decide(self, req, *a, **kw):
            p = super().decide(req, *a, **kw)
            if p.d > 1:  # keep token 1, stop at token 2 and drop it
                p.stop = StopRule([0.0] + [1.1] * (p.d - 1), [0.0] + [1.1] * (p.d - 2))
            return p

        def learn(self, req, plan, record):
            done.append((plan, record.emitted))
            super().learn(req, plan, record)
    done = []
    pl = StopAfterOne(curve(1.0), curve(0.1, first_ms=0.1), prior=0.95, max_draft=8, online=False)
    r = Engine(CycleRunner(), CharTokenizer(), ModelDrafter(CycleRunner()), "auto", planner=pl).generate(PROMPT, max_tokens=30)
    s = r.stats
    assert s.verification_rounds > 5 and max(p.d for p, _ in done) > 1
    assert {p for _, p, *_ in r.rounds} == {1}  # every draft was cut to one token
    t_plain = 1.0 / done[0][0].plain_rate  # frozen curves: every plan's plain rate is the same
    # predicted plain time: the tokens emitted after the prefill's, each at a plain step's price
    # (the plans' own E[N](d) would count tokens the early stops never drafted)
    assert s.predicted_plain_s - s.prefill_s == pytest.approx((s.emitted_tokens - 1) * t_plain)
    assert s.predicted_s - s.prefill_s == pytest.approx(sum(n / p.rate for p, n in done))


def test_early_stops_shorten_the_plan():
    # the draft is always right when it proposes, but stops after one token, unsure of the next
    # (p 0.2): the plan must follow what the rounds deliver, not stay at a long D with E[N] ~ D
    def run(report_stop):
        pl = planner(per_token_ms=2.0, prior=0.9, draft=curve(1.0, first_ms=1.0))
        req = pl.new_request(100_000)
        for _ in range(30):
            p = pl.decide(req)
            pl.learn(req, p, RoundRecord(1, 1, 2, [0.9], 0.2 if report_stop else None))
        p = pl.decide(req)
        return p.d, expected_tokens(req.acceptance.alpha(), p.d)
    (blind_d, blind_n), (told_d, told_n) = run(False), run(True)
    assert blind_d >= 6 and blind_n > 5  # before: every round "fully accepted", E[N] stays high
    assert told_d <= 2 and told_n < 2.5  # ~ what the rounds deliver: 2


def test_auto_without_a_drafter_is_plain_and_bad_d_is_rejected():
    r = Engine(CycleRunner(), CharTokenizer(), None, "auto").generate([0, 1, 2], max_tokens=6)
    assert r.token_ids == [3, 4, 0, 1, 2, 3] and r.stats.plain_steps == 6 and r.decisions is None
    with pytest.raises(ValueError, match="'auto'"):
        Engine(CycleRunner(), CharTokenizer(), NgramDrafter(), "four")


def test_draft_model_probes_when_uncertain_then_trusts_what_it_measured(no_looks):
    # the prior says drafting does not pay; the truth is full acceptance
    pl = planner(per_token_ms=2.0, prior=0.3, draft=curve(1.0, first_ms=2.0), )
    req = pl.new_request(10_000)
    first = pl.decide(req)
    assert first.probe and 1 <= first.d <= pl.cfg.probe_max  # short: exploring costs little
    for _ in range(10):
        p = pl.decide(req)
        pl.learn(req, p, RoundRecord(p.d, p.d, p.d + 1))
    assert pl.decide(req).d > pl.cfg.probe_max and not pl.decide(req).probe
    # the truth turns to full rejection: back to plain, and no probing every step
    chosen = []
    for _ in range(60):
        p = pl.decide(req)
        chosen.append(p.d)
        pl.learn(req, p, RoundRecord(p.d, 0, 1))
    assert chosen[-40:].count(0) >= 36  # a short probe every ~20 steps at most
    assert max(chosen[-40:]) <= pl.cfg.probe_max


def test_first_probe_skipped_once_the_workload_shows_the_draft_does_not_pay(no_looks):
    # many earlier requests measured acceptance ~1/4, where no D pays; a new request's own estimate
    # (one round's worth of that evidence) is still wide enough to call for a probe
    pl = planner(per_token_ms=2.0, prior=0.3, draft=curve(1.0, first_ms=2.0), )
    assert pl.decide(pl.new_request(10_000)).probe  # nothing seen yet: explore
    for i in range(40):
        r = pl.new_request(10_000)
        pl.learn(r, pl.decide(r), RoundRecord(2, int(i % 4 == 0), 1))
    req = pl.new_request(10_000)
    t = pl._prices(16, None, 0, 1)[1]
    assert best_draft_length(gains_of(req.acceptance.upper()), t, pl.target(1), pl.cfg.margin)[0] > 0  # its own optimism alone would probe
    assert pl.decide(req).d == 0
    # acceptance ~1/3: the workload's optimistic bound pays only a little, so a long prompt's
    # catch-up is not won back over a short request (no first probe), but is over a long one
    pl = planner(per_token_ms=2.0, prior=0.3, draft=curve(1.0, first_ms=2.0), )
    for i in range(40):
        r = pl.new_request(10_000)
        pl.learn(r, pl.decide(r), RoundRecord(2, int(i % 3 == 0), 1))
    assert pl.decide(pl.new_request(10_000), unseen=1).probe
    assert pl.decide(pl.new_request(3000), unseen=2000).d == 0  # its own optimism would: 1.7 ms saved a token
    assert pl.decide(pl.new_request(100_000), unseen=2000).probe
    # the same history with every draft accepted keeps drafting for new requests
    pl = planner(per_token_ms=2.0, prior=0.3, draft=curve(1.0, first_ms=2.0), )
    for _ in range(40):
        r = pl.new_request(10_000)
        pl.learn(r, pl.decide(r), RoundRecord(2, 2, 3))
    assert pl.decide(pl.new_request(10_000)).d > 0


def test_first_probes_stop_once_they_keep_failing_to_pay(no_looks):
    # each request's first probe pays a 500-token catch-up (0.5 s) and its speculative rounds then
    # save less than that (measured): new requests stop paying for first probes, a cheap one still runs
    def request(pl, spec_round_s):
        r = pl.new_request(1000)
        p = pl.decide(r, unseen=500)
        # (rounds reported without acceptance evidence, proposed = 0, so that only the measured
        # payoff differs between requests, not the acceptance estimate)
        pl.learn(r, p, RoundRecord(0, 0, 3, seconds=0.52))  # the probe: 3 tokens in 0.52 s (plain: 10 ms each)
        if p.probe:
            for _ in range(20):  # then speculation, 3 tokens a round
                pl.learn(r, Decision(2, 1.0, 1.0), RoundRecord(0, 0, 3, seconds=spec_round_s))
        pl.learn(r, Decision(0, 1.0, 1.0), RoundRecord(0, 0, r.remaining))  # it runs to max_tokens (expected_remaining)
        pl.finish(r, r.cap - r.remaining)
        return p.probe
    pl = planner(per_token_ms=2.0, prior=0.3, draft=curve(1.0, first_ms=2.0), )
    probed = [request(pl, 0.029) for _ in range(12)]  # 1 ms saved a round: 20 ms, not 490
    assert all(probed[:3]) and sum(probed[-6:]) <= 2, probed
    assert pl.decide(pl.new_request(1000), unseen=1).probe  # a probe without a catch-up still runs
    for _ in range(30):  # requests that do not probe widen the bound again: it explores again later
        pl.finish(pl.new_request(1000), 0)
    assert pl.decide(pl.new_request(1000), unseen=500).probe
    # first probes whose requests then save more than the catch-up keep being paid for
    pl = planner(per_token_ms=2.0, prior=0.3, draft=curve(1.0, first_ms=2.0), )
    assert all(request(pl, 0.005) for _ in range(12))  # 25 ms saved a round: 0.5 s over the request
    assert pl.catch_up.probes_pay() > 0.9


def test_first_probe_weighs_the_tighter_bound_by_the_chance_it_pays(no_looks):
    # acceptance ~1/3 over many requests: the workload's optimistic bound saves 0.3 ms a token, a
    # new request's own (wide) bound 1.7 ms; and 3 recent first probes did not pay off
    pl = planner(per_token_ms=2.0, prior=0.3, draft=curve(1.0, first_ms=2.0), )
    for i in range(40):
        r = pl.new_request(10_000)
        pl.learn(r, pl.decide(r), RoundRecord(2, int(i % 3 == 0), 1))
    for _ in range(3):
        r = pl.new_request(1000)
        r.probed, r.saved_s = True, -0.1
        pl.finish(r, r.cap - r.remaining)
    chance, catch_up = pl.catch_up.probes_pay(), pl.draft_cost(1, 2000) - pl.draft_cost(1, 1)
    assert 0.3 < chance < 0.45 and catch_up == pytest.approx(2.0, abs=0.01)
    # 10k tokens: 0.3 ms x 10k = 3 s and chance x 1.7 ms x 10k = 6.5 s each exceed the 2 s catch-up,
    # but the chance times the tighter saving, 0.38 x 3 s, does not: no first probe
    assert pl.decide(pl.new_request(10_000), unseen=2000).d == 0
    assert pl.decide(pl.new_request(100_000), unseen=2000).probe  # 11 s > 2 s: it probes


def test_catch_up_priced_by_the_measured_long_forward():
    # without a long-forward point, 256 tokens extrapolate the k<=17 curve; with one, they cost it
    c = CostCurve({1: [10.0 + k for k in range(17)]}, prefill=(256, 100.0))
    assert c(17) == pytest.approx(0.026) and c(256) == pytest.approx(0.100)
    assert c(512) == pytest.approx(0.200)  # past it: the long forward's rate per token
    assert c(17, 2) == pytest.approx(0.052)  # only one sequence was measured at that length


def test_a_request_unlike_the_workload_overrides_its_prior_within_rounds():
    ms = [102, 131, 162, 192, 225, 249, 279, 296, 290, 295, 309, 299, 306, 307, 313, 314, 429]  # llama.cpp 1.5B
    pl = Planner(CostCurve({1: ms}), None, prior=[0.4] + [0.75] * 15, max_draft=16)
    for _ in range(3):  # code edits: every n-gram draft accepted
        req = pl.new_request(64)
        for _ in range(8):
            p = pl.decide(req, available=12)
            pl.learn(req, p, RoundRecord(p.d, p.d, p.d + 1))
    req, chosen = pl.new_request(64), []
    for _ in range(20):  # then a summary: every draft rejected at its first token
        p = pl.decide(req, available=12)
        chosen.append(p.d)
        pl.learn(req, p, RoundRecord(p.d, 0, 1))
        if p.d == 0:
            pl.shadow(req, 0.0)
    assert chosen[0] == 12 and chosen[4:] == [0] * 16


def test_shadows_of_the_first_position_keep_what_deeper_positions_measured():
    # a cheap drafter on prose: its first token often right (measured by shadows during plain
    # stretches), its second always wrong when verified; the plain stretches between rounds must
    # not wash out the deeper positions' rejections, or every round drafts long and loses
    ms = [102, 131, 162, 192, 225, 249, 279, 296, 290, 295, 309, 299, 306, 307, 313, 314, 429]  # llama.cpp 1.5B
    pl = Planner(CostCurve({1: [m / 4 + 75 for m in ms]}), None, prior=0.9, max_draft=16)
    req, chosen = pl.new_request(10_000), []
    for _ in range(30):
        p = pl.decide(req, available=12)
        if p.d:
            chosen.append(p.d)
            pl.learn(req, p, RoundRecord(p.d, 1, 2))  # first accepted, second rejected
        for _ in range(6):  # a plain stretch: the drafter's first token is right every time
            pl.learn(req, Decision(0, 1.0, 1.0), RoundRecord(0, 0, 1))
            pl.shadow(req, 1.0)
    assert len(chosen) >= 20 and max(chosen[-10:]) <= 3  # 1 or 2, plus one position tried deeper


def test_calibration_per_bin_of_the_draft_probability():
    cal = Calibration()
    assert cal(0.3) == pytest.approx(0.3) and cal.threshold(0.3) == pytest.approx(0.3)  # nothing measured: c
    assert cal.threshold(1.5) > 1.0  # a bar no token can reach
    for i in range(600):  # code: tokens at c = 0.95 always accepted, tokens at c = 0.3 90% of the time
        cal.observe([0.95] * 9 + [0.3], accepted=10 if i % 10 else 9, reached=10)
    # one ratio would say 0.3 x 1.07 ~ 0.32 for the c = 0.3 tokens; per bin they are ~0.9
    assert cal.scale == pytest.approx(9.9 / 8.85, abs=0.01)
    assert cal(0.3) == pytest.approx(0.9, abs=0.03) and cal(0.95) == pytest.approx(1.0, abs=0.02)
    assert cal.threshold(0.8) == pytest.approx(0.3)  # the bin's lower edge: all of it reaches 0.8
    assert cal(0.5) == pytest.approx(0.9, abs=0.03)  # non-decreasing: an empty bin above borrows up
    assert all(cal(a) <= cal(b) + 1e-12 for a, b in zip(np.linspace(0, 1, 50), np.linspace(0, 1, 50)[1:]))
    # and the planner's early-stop bars follow: a draft at c = 0.3 is no longer cut short
    pl = planner(per_token_ms=2.0, prior=0.9, draft=curve(1.0, first_ms=1.0))
    req = pl.new_request(100_000)
    for _ in range(200):
        pl.learn(req, pl.decide(req), RoundRecord(4, 4, 5, [0.3] * 4))
    p = pl.decide(req)
    assert p.d >= 4 and max(p.stop.go_on[:3]) <= 0.3 and max(p.stop.keep[:4]) <= 0.3  # c < bar stops


def test_a_deeper_position_is_tried_only_where_its_verify_cost_can_pay():
    # torch's verify curve steps up at k = 4 (~1.8x k = 3); on prose-like acceptance D = 2 is best,
    # and "always try one position deeper when optimism prefers a longer draft" paid k = 4 in a
    # quarter of the rounds (13% slower than D = 2 here): exploring must be priced too
    ms = [262, 274, 282, 508, 535, 533, 719, 722, 727, 849, 863, 858, 1007, 1001, 1015, 877, 911]
    true = np.array([0.6, 0.6, 0.5] + [0.4] * 13)
    pl = Planner(CostCurve({1: ms}), None, prior=0.9, max_draft=16)
    rng = np.random.default_rng(0)
    chosen, t, n = [], 0.0, 0
    for _ in range(40):
        req = pl.new_request(64)
        while req.remaining > 1:
            p = pl.decide(req, available=12)
            acc = 0
            while acc < p.d and rng.random() < true[acc]:
                acc += 1
            pl.learn(req, p, RoundRecord(p.d, acc, acc + 1))
            if p.d:
                chosen.append(p.d)
            else:
                pl.shadow(req, float(rng.random() < true[0]))
            t, n = t + ms[p.d] / 1e3, n + acc + 1
    assert sum(d >= 3 for d in chosen) <= 0.02 * len(chosen)
    assert n / t >= 0.97 * expected_tokens(true, 2) / ms[2] * 1e3  # D = 2's rate


def test_a_draft_model_looks_at_the_targets_confidence_before_paying_the_prompts_catch_up():
    # llama.cpp-like: the 0.5B draft costs ~0.45 of a 1.5B step and its catch-up on a 120-token
    # prompt ~0.45 s (4 plain steps), so on prose (acceptance ~0.6) no D pays; after code requests,
    # the recent requests' acceptance alone said "speculate" and every prose request paid a catch-up
    target = CostCurve({1: [94, 127, 161, 196, 224, 251, 275, 287, 288, 291, 292, 288, 296, 300, 303, 308, 397]})
    draft = CostCurve({1: [43, 48, 54, 61, 84, 91, 100, 99, 119, 124, 127, 117, 144, 153, 161, 170, 188]}, (80, 300.0))

    def run(pl, top, accept, n=128):  # one request; returns the D of each step
        req, ds, unseen = pl.new_request(n), [], 121
        while req.remaining > 1:
            p = pl.decide(req, available=req.remaining - 1, unseen=unseen)
            acc = 0
            while acc < p.d and accept[acc]:
                acc += 1
            reached = min(acc + 1, p.d)
            pl.learn(req, p, RoundRecord(p.d, acc, acc + 1, [0.9] * p.d if p.d else None, target_top=[top] * max(reached, 1) if top is not None else None))
            unseen = 1 if p.d else unseen + 1
            ds.append(p.d)
        return ds

    code, prose = [True] * 16, [True, False] * 8
    for use_top in (False, True):
        pl = Planner(target, draft, prior=0.6, max_draft=16)
        with pytest.MonkeyPatch.context() as mp:
            if not use_top:  # without looks or the target's confidence: the old behaviour
                mp.setattr(CatchUp, "looks", staticmethod(lambda *a: False))
            for _ in range(6):
                ds = run(pl, 0.95 if use_top else None, code)
            looks = ds.index(15) if use_top else 0  # look first (about a catch-up's worth), then draft
            assert ds[:looks] == [0] * looks and looks <= 16 and sum(ds) >= 80
            ds = run(pl, 0.45 if use_top else None, prose)
        if use_top:  # the target's low confidence on its first tokens: no catch-up paid, no round
            assert not any(ds)
        else:  # the recent requests' acceptance alone: it pays a catch-up
            assert any(ds)
    code_after = run(pl, 0.95, code)  # and code after prose drafts again once it has looked
    assert code_after[0] == 0 and sum(code_after) >= 80


def test_auto_logs_each_steps_plan_and_predicted_time():
    draft_runner = CycleRunner()
    pl = planner(per_token_ms=1.0, prior=0.95, draft=curve(0.1, first_ms=0.1), online=False)
    r = Engine(CycleRunner(), CharTokenizer(), ModelDrafter(draft_runner), "auto", planner=pl).generate(PROMPT, max_tokens=30)
    s = r.stats
    assert len(r.decisions) == s.verification_rounds + s.plain_steps - 1  # every step after the prefill's token
    assert [p for _, p, *_ in r.rounds] == [p for _, p, *_ in r.decisions if p > 0]
    t_plain = 1e3 * (pl.target(1) + pl.overhead_s)
    for d, proposed, unseen, pred_ms, meas_ms, draft_ms, _ in r.decisions:
        assert proposed <= d and meas_ms > 0 and draft_ms == pytest.approx(1e3 * pl.draft(1), abs=0.05)
        if d == 0:
            assert (proposed, unseen) == (0, 0) and pred_ms == pytest.approx(t_plain, abs=0.05)
        else:  # a round's time as the plan priced it: catch-up, d draft steps and a verify of d + 1
            catch_up = pl.draft_cost(1, unseen) - pl.draft_cost(1, 1)
            round_s = pl.draft_cost(d) + pl.target(d + 1) + pl.overhead_s
            assert unseen >= 1 and pred_ms == pytest.approx(1e3 * (round_s + catch_up), abs=0.05)
    first = next(i for i, p in enumerate(r.decisions) if p[0] > 0)  # it caught up on the prompt and every token
    assert r.decisions[first].unseen == len(PROMPT) + first + 1
    assert Engine(CycleRunner(), CharTokenizer(), ModelDrafter(CycleRunner()), 2).generate(PROMPT, max_tokens=5).decisions is None


def test_a_draft_model_looks_until_the_saving_it_forgoes_reaches_the_prompts_catch_up():
    # torch-like: a plain step costs 288 ms and the 0.5B model, believed right 9 times in 10, would
    # emit a token every ~140 ms, so each plain step forgoes ~0.15 s (rent or buy, _looks). Its
    # catch-up on a prompt of 41 tokens costs ~0.27 s: two looks; on 401 tokens ~1.3 s: eight; on
    # 854 tokens ~2.9 s: nineteen (a rule on the seconds run, not the saving, paid it after ten)
    target = CostCurve({1: [288, 304, 327, 400, 404, 410, 407, 439, 445, 435, 468, 463, 470, 467, 516, 481, 736]})
    draft = CostCurve({1: [99, 108, 125, 213, 212, 223, 246, 253, 255, 276, 281, 285, 305, 307, 316, 292, 311]},
                      (256, 889.0))
    pl = Planner(target, draft, prior=0.9, max_draft=8)
    for prompt in (41, 120, 401, 854):
        req, unseen, ds, forgone = pl.new_request(64), prompt, [], []
        while not any(ds):
            p = pl.decide(req, available=8, unseen=unseen)
            forgone.append(req.forgone_s)
            assert req.model_rate > 1 / target(1)  # the model would pay on this estimate
            rate = req.model_rate  # asked again with nothing available (a head lacking features): kept
            assert pl.decide(req, available=0, unseen=unseen).d == 0 and req.model_rate == rate
            pl.learn(req, p, RoundRecord(p.d, p.d, p.d + 1, [0.9] * p.d if p.d else None, target_top=[0.95] * max(p.d, 1)))
            ds.append(p.d)
            unseen += 1
        looks, catch_up = len(ds) - 1, pl.draft_cost(1, unseen - 1) - pl.draft_cost(1, 1)
        assert ds[:-1] == [0] * looks and ds[-1] > 0, (prompt, ds)
        step = target(1) - 1 / req.model_rate  # what one more plain step would forgo
        assert forgone[-1] + step > catch_up and (looks == 0 or forgone[-2] + step <= catch_up)
        assert looks == {41: 2, 120: 3, 401: 8, 854: 19}[prompt]
    req, plain_rate = pl.new_request(64), 1 / target(1)
    assert CatchUp.looks(req, 0.2, plain_rate) and not CatchUp.looks(req, -0.1, plain_rate)  # nothing forgone yet
    req.model_rate = 7.0  # a step forgoes 0.288 - 1 / 7 s: more than a catch-up of 0.1 s
    assert CatchUp.looks(req, 0.2, plain_rate) and not CatchUp.looks(req, 0.1, plain_rate)


def test_risk_asks_more_of_a_round_the_more_plain_steps_it_wastes_if_rejected():
    # llama.cpp on 2 EPYC cores: verifying 2 tokens costs 2.2 plain steps and 16 cost 8, so only
    # long drafts can pay, and one that fails wastes ~7 plain steps; at a 0.915 estimate a 15-token
    # round promises 1.14x plain, which the risk term (0.03 a wasted step) asks 1.24x of
    epyc = CostCurve({1: [39, 85, 110, 134, 159, 182, 211, 284, 284, 288, 309, 297, 301, 304, 302, 312, 385]})

    def first_plan(curve, risk):
        pl = Planner(curve, prior=0.915, max_draft=16, risk=risk)
        return pl.decide(pl.new_request(100))

    plans = {r: first_plan(epyc, r) for r in (0.0, 0.03)}
    assert plans[0.0].d >= 14 and 1.1 < plans[0.0].rate / plans[0.0].plain_rate < 1.2
    assert plans[0.03].d == 0
    # torch-like: a rejected 9-token round wastes half a plain step, and the term changes nothing
    torch_like = CostCurve({1: [288, 304, 327, 400, 404, 410, 407, 439, 445, 435, 468, 463, 470, 467, 516, 481, 736]})
    ds = [first_plan(torch_like, r).d for r in (0.0, 0.03)]
    assert ds[0] == ds[1] > 0


def test_a_round_in_a_batch_is_priced_by_the_step_it_joins():
    """Hand-computed: T(k, b) = 10 + k b ms; alpha = 0.8 at every position; ragged batches run as
    llama.cpp's equal-split ubatches."""
    from draftwise.backends.base import equal_split_parts

    curve = CostCurve({b: [10 + k * b for k in range(1, 10)] for b in (1, 8)})
    pl = Planner(curve, None, prior=0.8, max_draft=4, online=False, probe_max=0, margin=0.03, risk=0.0)
    pl.draft_call_s = 0.0
    req = pl.new_request(100)
    assert pl.decide(req, available=4).d == 4  # alone: 3.36 tokens in 15 ms against 1 in 11
    split = equal_split_parts  # LlamaRunner.forward_parts with a stream per sequence (no trees)
    # 7 plain sequences: D = 4 adds a 14 ms ubatch to an 18 ms step, (7 + 3.36) / 32 < 8 / 18
    assert pl.decide(req, Batch.of(8, split), available=4).d == 0
    # all 8 alike: E(d) / T(d + 1, 8): 1.8 / 26, 2.44 / 34, 2.95 / 42, 3.36 / 50 against 1 / 18
    alike = pl.decide(req, Batch.of(8, split, uniform=True), available=4)
    assert alike.d == 2 and alike.step_rate == pytest.approx(2.44 / 0.034)
    # the 7 others already feed 3 tokens each, expecting 2.44: joining them at 3 costs 34 ms
    # for 17.08 + 2.44 tokens; plain would leave a 24 ms ubatch of theirs after an 18 ms one
    joined = Batch([3] * 7 + [1], [2.44] * 7 + [1.0], split)
    p = pl.decide(req, joined, 7, available=4)
    assert p.d == 2 and p.step_rate == pytest.approx((7 * 2.44 + 2.44) / 0.034)
    assert p.rate == pytest.approx(2.44 / 0.034) and p.plain_rate == pytest.approx(1 / 0.042)
    assert joined.feeds[7] == 1  # decide does not record; the policy does
    assert split([1, 5, 1, 3]) == [(1, 4), (2, 2), (2, 1)] and split([2, 2]) == [(2, 2)]


def test_ragged_steps_learn_their_own_correction():
    curve = CostCurve({1: [10.0, 20.0], 8: [40.0, 80.0]})
    curve.observe(1, 8, 0.030)  # a plain step of 8 measured below the profile: that point moves
    plain = curve(1, 8)
    assert plain < 0.040 and curve.ragged == 1.0
    for _ in range(50):  # steps run as (1 x 8) + (1 x 1) measured at twice their prediction
        curve.observe_parts([(1, 8), (1, 1)], 2 * (curve(1, 8) + curve(1, 1)))
    assert curve(1, 8) == plain  # the one-forward points keep what one-forward steps showed
    assert curve.ragged == pytest.approx(2.0, rel=0.01)
    assert curve.parts([(1, 8), (1, 1)]) == pytest.approx(2 * (plain + curve(1, 1)), rel=0.01)
    assert curve.parts([(1, 8)]) == plain


def test_plain_step_of_a_batch_size_is_measured_before_drafting_at_it():
    """The profile's plain point at b = 16 was 22% above the running engine's (docs/data/
    ragged_steps_qwen.txt): no step that drafts measures it, so the planner measures it first."""
    from draftwise.backends.base import equal_split_parts
    from draftwise.costs import MEASURE

    curve = CostCurve({1: [2 + k for k in range(1, 10)], 16: [40 + 16 * k for k in range(1, 10)]})
    pl = Planner(curve, None, prior=0.8, max_draft=4, probe_max=0, margin=0.03, risk=0.0)
    pl.draft_call_s = 0.0
    req = pl.new_request(1000)
    # the profile: a plain step of 16 costs 56 ms; one request drafting 4 adds a (4 x 1) ubatch,
    # 6 ms: (15 + 3.36) / 62 > 16 / 56 x 1.03, so it would draft
    assert Planner(curve, None, prior=0.8, max_draft=4, probe_max=0, online=False).decide(
        req, Batch.of(16, equal_split_parts), available=4).d > 0
    for i in range(MEASURE):  # online: plain until the plain step of 16 was measured twice
        assert pl.decide(req, Batch.of(16, equal_split_parts), available=4).d == 0
        pl.observe_times(1, 16, [0.040, 0.030][i], draft_forwards=0, unseen=1, draft_s=0.0, overhead_s=0.0,
                         parts=[(1, 16)])
    # measured at 30 ms (the fastest of the two: a stall only adds), a plain step beats the draft:
    # 16 / 30 against (15 + 3.36) / ~36, the ragged step's (1 x 16) ubatch priced as measured too
    assert curve.plain(16) == pytest.approx(0.030)
    assert curve.parts([(1, 16)], 16) == pytest.approx(0.030)
    assert curve.parts([(1, 16), (4, 1)], 16) == pytest.approx(0.030 + curve(4, 1))
    assert pl.decide(req, Batch.of(16, equal_split_parts), available=4).d == 0
    assert pl.decide(req, available=4).d > 0  # one sequence is not waited for: 2.95 tokens in 6 ms against 1 in 3
    # a batch size whose steps never run plain (requests fixing their own D) is not waited on
    # forever: after 2 x MEASURE steps of other shapes the curve prices its plain step
    for _ in range(2 * MEASURE):
        pl.observe_times(3, 8, 0.5, draft_forwards=2, unseen=1, draft_s=0.0, overhead_s=0.0, parts=[(3, 8)])
    assert curve.plain_known(8) and not curve.plain_known(4) and curve.plain_known(1)


def test_a_catch_up_is_weighed_by_how_long_recent_requests_ran_not_by_max_tokens(no_looks):
    draft = curve(per_token_ms=1.0, first_ms=2.0)  # a catch-up of 200 tokens costs ~200 ms
    pl = planner(per_token_ms=0.5, prior=0.9, draft=draft, )
    fresh = pl.new_request(400)
    assert pl.catch_up.remaining(fresh) == 400 and pl.decide(fresh, unseen=200).d > 0  # nothing known yet
    for _ in range(20):  # recent requests stopped (EOS) after 10 tokens
        r = pl.new_request(400)
        pl.learn(r, Decision(0, 1.0, 1.0), RoundRecord(0, 0, 10))
        pl.finish(r, r.cap - r.remaining)
    fresh = pl.new_request(400)
    assert pl.catch_up.remaining(fresh) == pytest.approx((400 + 20 * 10) / 21)  # the cap as one prior request
    assert pl.decide(fresh, unseen=200).d == 0  # ~29 tokens to save on: the catch-up cannot pay
    late = pl.new_request(400)
    pl.learn(late, Decision(0, 1.0, 1.0), RoundRecord(0, 0, 10))  # past where they all stopped: no evidence, all the room
    assert pl.catch_up.remaining(late) == 390
    for _ in range(20):  # requests cut at their max_tokens had not finished: they count as running on
        r = pl.new_request(50)
        pl.learn(r, Decision(0, 1.0, 1.0), RoundRecord(0, 0, 50))
        pl.finish(r, r.cap - r.remaining)
    assert pl.catch_up.remaining(pl.new_request(400)) == pytest.approx((400 + 20 * 10 + 20 * 400) / 41)


def test_the_planner_records_how_long_requests_ran_and_whether_max_tokens_cut_them():
    pl = planner(per_token_ms=0.2, prior=0.5)
    eng = Engine(CycleRunner(), CharTokenizer(), NgramDrafter(1, 3), "auto", planner=pl)
    cut = eng.generate(PROMPT, max_tokens=40)
    stopped = eng.generate(PROMPT, max_tokens=40, stop=["bcdeab"])  # the cycle is abcde: ends early
    assert len(cut.token_ids) == 40 and stopped.finish_reason == "stop" and len(stopped.token_ids) < 40
    # the tokens after the first (the prefill's), and whether the request ended before its cap
    assert list(pl.catch_up.lengths) == [(39, False), (len(stopped.token_ids) - 1, True)]
