from draftwise.stats import SpecStats, aggregate


def test_derived_metrics_and_merge():
    s = SpecStats()
    s.record_round(4, 4)  # all accepted: emits 5
    s.record_round(4, 1)  # emits 2
    s.round_emitted_tokens, s.plain_steps, s.emitted_tokens, s.wall_s = 7, 1, 8, 2.0
    assert s.acceptance_rate == 5 / 8
    assert s.acceptance_length == 3.5
    assert s.proposed_per_position == [2, 2, 2, 2] and s.accepted_per_position == [2, 1, 1, 1]
    assert s.per_position_acceptance == [1.0, 0.5, 0.5, 0.5]
    assert s.ms_per_emitted_token == 250.0
    t = SpecStats()
    t.record_round(2, 0)
    t.round_emitted_tokens = t.emitted_tokens = 1
    agg = aggregate([s, t])
    assert agg.requests == 2 and agg.proposed_tokens == 10 and agg.verification_rounds == 3
    assert agg.acceptance_length == 8 / 3
    assert agg.proposed_per_position == [3, 3, 2, 2]


def test_empty_stats_have_no_ratios():
    s = SpecStats()
    assert s.acceptance_rate is None and s.acceptance_length is None and s.ms_per_emitted_token is None
