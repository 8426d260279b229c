"""The service goal: parsing, verdicts on hand-built summary rows, and one colour per configuration
in every plot."""
import pytest

from draftwise.bench.goal import METRICS, Condition, judge, measured, parse_goal
from draftwise.bench.plots import PALETTE, config_colours
from draftwise.bench.summary import Latency, Row, Summary


def row(config="ngram:4", speedup=1.08, lo=1.06, hi=1.15, itl_p95=0.2, ttft_p99=1.5, concurrency=1, scope="all",
        **kw):
    lat = lambda p95=0.1, p99=0.2: Latency(10, 0.05, 0.04, p95, p99)  # noqa: E731
    return Row(scope, config, concurrency, False, 10, 5, 100, lat(p99=ttft_p99), lat(p95=itl_p95), lat(), 50.0, 20.0,
               speedup=speedup, speedup_lo=lo, speedup_hi=hi, **kw)


# --- parsing -------------------------------------------------------------------------------

def test_parse_goal():
    assert parse_goal("itl_p95<=0.25,ttft_p99<=2,speedup>=1.05") == (
        Condition("itl_p95", "<=", 0.25), Condition("ttft_p99", "<=", 2.0), Condition("speedup", ">=", 1.05))
    assert parse_goal(" tokens_per_s > 40 , mismatches < 1, e2e_mean ≤ 3") == (
        Condition("tokens_per_s", ">", 40.0), Condition("mismatches", "<", 1.0), Condition("e2e_mean", "<=", 3.0))
    assert str(parse_goal("speedup>=1.05")[0]) == "speedup>=1.05"


@pytest.mark.parametrize("text, part", [("itl_p95<=0.25,latency<=1", "'latency<=1': unknown metric 'latency'"),
                                        ("speedup=>1.05", "'speedup=>1.05': expected METRIC OP VALUE"),
                                        ("speedup>=fast", "'fast' is not a finite number"),
                                        ("speedup>=nan", "'nan' is not a finite number"),
                                        ("speedup>=", "no value after '>='"),
                                        ("speedup>=1.05,", "goal part '': expected"),
                                        ("speedup 1.05", "expected METRIC OP VALUE"),
                                        ("  ", "empty goal")])
def test_malformed_goals_name_the_bad_part_and_the_metrics(text, part):
    with pytest.raises(ValueError) as e:
        parse_goal(text)
    assert part in str(e.value)
    if "number" not in part and "value" not in part:
        assert "metrics: ttft_p50, ttft_p95" in str(e.value) and "acceptance_length, mismatches" in str(e.value)


def test_every_metric_reads_a_row():
    r = row(acceptance_rate=0.7, acceptance_length=2.5, mismatches=1)
    values = {m: measured(r, m) for m in METRICS}
    assert values["itl_p95"] == 0.2 and values["ttft_p99"] == 1.5 and values["e2e_mean"] == 0.05
    assert values["tokens_per_s"] == 50.0 and values["ms_per_token"] == 20.0 and values["speedup"] == 1.08
    assert (values["acceptance_rate"], values["acceptance_length"], values["mismatches"]) == (0.7, 2.5, 1)


# --- verdicts ------------------------------------------------------------------------------

GOAL = parse_goal("itl_p95<=0.25,ttft_p99<=2,speedup>=1.05")


def test_a_row_meeting_every_condition_is_kept():
    v = judge(row(), GOAL, "plain")
    assert v.keep is True and v.metric is None and v.short == "keep"
    assert v.text == "keep (itl_p95 0.2 ≤ 0.25, ttft_p99 1.5 ≤ 2, speedup 1.08 ≥ 1.05)"


def test_the_first_condition_missed_decides():
    v = judge(row(itl_p95=0.31, speedup=0.9), GOAL, "plain")  # misses two: the goal's order decides
    assert (v.keep, v.metric, v.text) == (False, "itl_p95", "don't keep (itl_p95 0.31 > 0.25)")
    assert v.short == "don't keep: itl_p95"
    v = judge(row(speedup=1.01, lo=0.95, hi=1.1), GOAL, "plain")
    assert v.text == "don't keep (speedup 1.01 < 1.05)"
    assert judge(row(), parse_goal("tokens_per_s>50"), "plain").text == "don't keep (tokens_per_s 50 ≤ 50)"


def test_a_value_next_to_its_bound_is_printed_apart_from_it():
    v = judge(row(itl_p95=0.2501), GOAL, "plain")
    assert v.text == "don't keep (itl_p95 0.2501 > 0.25)"


def test_the_baseline_is_not_judged():
    v = judge(row(config="plain", speedup=1.0, lo=None, hi=None), GOAL, "plain")
    assert (v.keep, v.text, v.short) == (None, "baseline", "baseline")


def test_a_missing_metric_is_not_kept():
    v = judge(row(speedup=None, lo=None, hi=None), GOAL, "plain")
    assert (v.keep, v.metric, v.text) == (False, "speedup", "don't keep (speedup not measured)")
    assert judge(row(), parse_goal("acceptance_rate>=0.5"), "plain").text == \
        "don't keep (acceptance_rate not measured)"
    assert judge(row(), parse_goal("mismatches<=0"), "plain").keep is True
    assert judge(row(), parse_goal("mismatches<=0"), "plain", mismatches_checked=False).text == \
        "don't keep (mismatches not measured)"  # sampling: outputs were not compared
    assert judge(row(mismatches=2), parse_goal("mismatches<=0"), "plain").text == "don't keep (mismatches 2 > 0)"


def test_a_speedup_interval_that_includes_a_miss_is_reported():
    v = judge(row(speedup=1.08, lo=0.99, hi=1.17), parse_goal("speedup>=1.05"), "plain")
    assert v.keep is True and v.metric == "speedup" and v.short == "keep, speedup uncertain"
    assert v.text == "keep (speedup 1.08 ≥ 1.05; interval [0.99, 1.17] includes a miss)"
    v = judge(row(speedup=0.9, lo=0.8, hi=1.02), parse_goal("speedup<=1"), "plain")  # an upper bound: the top end
    assert v.text == "keep (speedup 0.9 ≤ 1; interval [0.80, 1.02] includes a miss)"
    v = judge(row(speedup=1.2, lo=None, hi=None), parse_goal("speedup>=1.05"), "plain")
    assert v.text == "keep (speedup 1.2 ≥ 1.05; one prompt: no interval)"


# --- colours -------------------------------------------------------------------------------

def summary(rows):
    return Summary({}, {}, [], "plain", None, [], rows)


def test_one_colour_per_configuration_in_order_of_appearance():
    rows = [row("plain"), row("ngram:4"), row("model:4"), row("ngram:4", scope="category:a"),
            row("plain", concurrency=2), row("model:4", concurrency=2)]
    assert config_colours(summary(rows)) == {"plain": PALETTE[0], "ngram:4": PALETTE[1], "model:4": PALETTE[2]}
    many = [row(f"ngram:{d}") for d in range(1, 23)]
    colours = config_colours(summary(many))
    assert len(set(list(colours.values())[:20])) == 20 and colours["ngram:21"] == PALETTE[0]


def test_every_figure_draws_a_configuration_in_its_colour():
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from draftwise.bench import plots

    cdf = {k: [0.01 * q for q in range(101)] for k in ("e2e_s", "ttft_s", "itl_s")}
    step = {"steps": 10, "prefill_per_request": 5.0, "draft": 1.0, "verify": 8.0, "other": 0.5}
    rows = [row("plain", cdf=cdf, step_ms=step), row("ngram:4", cdf=cdf, per_position_acceptance=[0.9, 0.5],
                                                     step_ms=step),
            row("model:4", cdf=cdf, per_position_acceptance=[0.8, 0.6], step_ms=step),
            row("ngram:2", cdf=cdf, per_position_acceptance=[0.9], step_ms=step)]
    rows += [row(r.config, concurrency=2, speedup=0.9) for r in rows]
    colours = {"plain": "#111111", "ngram:4": "#222222", "model:4": "#333333", "ngram:2": "#444444"}
    c1 = [r for r in rows if r.concurrency == 1]
    seen = {}
    for make, of in ((plots._cdfs, c1), (plots._per_position, c1), (plots._speedup_vs_d, c1),
                     (plots._concurrency, [r for r in rows if r.config != "plain"])):
        fig = make(of, plt, colours)
        for ax in fig.axes:
            for line in ax.get_lines():
                if line.get_label() in colours:
                    seen.setdefault(line.get_label(), set()).add(to_hex(line.get_color()))
        plt.close(fig)
    assert seen == {name: {c} for name, c in colours.items()}
    fig = plots._time_split(c1, plt, colours)
    ticks = {t.get_text(): to_hex(t.get_color()) for t in fig.axes[0].get_xticklabels()}
    assert ticks == colours
    plt.close(fig)
