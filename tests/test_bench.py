"""The benchmark harness on a toy runner: configuration parsing, interleaved order, resuming,
percentiles and bootstrap intervals, the output check, summaries and the report."""
import html
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from draftwise import prompts
from draftwise.bench import BenchConfig, load_prompts, run_bench, summarise, write_report
from draftwise.bench.check import Mismatch, find_mismatches
from draftwise.bench.config import RunConfig, context_bucket, parse_configs
from draftwise.bench.measure import timing_fields
from draftwise.bench.plots import break_even, draft_length
from draftwise.bench.report import check_text, format_table
from draftwise.bench.results import REQUESTS, Results
from draftwise.bench.run import plan
from draftwise.bench.summary import Latency, Summary, bootstrap_ratio, in_noise, percentile
from draftwise.drafters.base import Proposal
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.prompts import DATA_FILES, data_file
from draftwise.scheduler import Scheduler
from draftwise.verify import VerifyResult
from fakes import CharTokenizer, CheapDrafter, CycleRunner

TEXTS = ["abcdeab", "cdeabcdea", "eabcdeabcdeab", "bcdeabc"]  # the cycle 0..4: n-gram drafts are right


def write_workload(tmp_path, texts=TEXTS):
    path = tmp_path / "w.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "category": "odd" if i % 2 else "even", "prompt": t}) + "\n"
                            for i, t in enumerate(texts)))
    return str(path)


def fake_engines(runner=None, extra=None):
    runner, tok = runner or CycleRunner(), CharTokenizer()
    out = {"plain": Engine(runner, tok), "ngram:2": Engine(runner, tok, NgramDrafter(1, 3), 2),
           "ngram:4": Engine(runner, tok, NgramDrafter(1, 3), 4)}
    for name, make in (extra or {}).items():
        out[name] = make(runner, tok)
    return out


def config(tmp_path, **kw):
    base = dict(target="fake", workload=write_workload(tmp_path), n_per_category=None, configs=("plain", "ngram:2,4"),
                max_tokens=12, out_dir=str(tmp_path / "out"), context_edges=(8,))
    return BenchConfig(**{**base, **kw})


def requests(path):
    return [json.loads(line) for line in open(path) if json.loads(line)["kind"] == "request"]


# --- configuration -------------------------------------------------------------------------

def test_parse_configs_and_sweeps():
    names = [c.name for c in parse_configs(["plain", "ngram:2,4", "model:3"])]
    assert names == ["plain", "ngram:2", "ngram:4", "model:3"]
    assert RunConfig.parse("model:8") == [RunConfig("model:8", "model", 8)]
    for bad in (["eagle:4"], ["ngram"], ["ngram:0"], ["ngram:x"], ["ngram:4", "ngram:2,4"]):
        with pytest.raises(ValueError):
            parse_configs(bad)


@pytest.mark.parametrize("kw", [dict(concurrency=()), dict(concurrency=(1, 0)), dict(baseline="ngram:9"),
                                dict(context_edges=(512, 256)), dict(temperature=-1.0), dict(max_tokens=0),
                                dict(repeats=0), dict(endpoint_api="grpc"), dict(prompt_cache_mb=-1)])
def test_bench_config_rejects_bad_settings(kw):
    with pytest.raises(ValueError):
        BenchConfig(**kw)


def test_endpoints_become_the_configurations():
    cfg = BenchConfig(endpoints={"vllm-plain": "http://h:1", "vllm-eagle": "http://h:2"})
    assert cfg.configs == ("vllm-plain", "vllm-eagle") and cfg.baseline == "vllm-plain"


def test_context_buckets():
    assert [context_bucket(n, (512,)) for n in (0, 511, 512, 9000)] == ["<512", "<512", ">=512", ">=512"]
    assert [context_bucket(n, (512, 2048)) for n in (5, 600, 2048)] == ["<512", "512-2047", ">=2048"]


def test_load_prompts_samples_per_category_with_a_seed(tmp_path):
    path = write_workload(tmp_path, ["ab", "bc", "cd", "de", "ea", "ab"])
    cfg = BenchConfig(workload=path, n_per_category=2, seed=1)
    a, b = load_prompts(cfg), load_prompts(cfg)
    assert [p.id for p in a] == [p.id for p in b] and len(a) == 4
    assert sorted(p.category for p in a) == ["even", "even", "odd", "odd"]
    assert [p.id for p in a] == sorted((p.id for p in a), key=lambda i: int(i[1:]))  # file order kept


def test_packaged_data_matches_its_checksums(tmp_path, monkeypatch):
    for rel in DATA_FILES:
        assert data_file(rel).is_relative_to(Path(prompts.__file__).parent)  # inside the package
    (tmp_path / "edit_eval").mkdir()
    (tmp_path / "edit_eval" / "edit_eval.jsonl").write_text('{"task_id": "x"}\n')
    monkeypatch.setenv("DRAFTWISE_DATA", str(tmp_path))
    with pytest.raises(ValueError, match="SHA-256"):
        data_file("edit_eval/edit_eval.jsonl")
    with pytest.raises(FileNotFoundError, match="humaneval"):
        data_file("humaneval/HumanEval.jsonl.gz")


def test_load_prompts_from_the_packaged_data():
    prose = load_prompts(BenchConfig(workload="prose", n_per_category=2))
    assert sorted({p.category for p in prose}) == ["humanities", "roleplay", "writing"] and len(prose) == 6
    assert all(len(p.messages) == 1 for p in prose)  # first turn only unless asked for both
    both = load_prompts(BenchConfig(workload="writing", n_per_category=1, both_turns=True))
    assert len(both[0].messages) == 2
    spec = load_prompts(BenchConfig(workload="specbench", n_per_category=1))
    assert len({p.category for p in spec}) == 13
    mixed = load_prompts(BenchConfig(workload="editeval,humaneval", n_per_category=3))
    assert {p.category for p in mixed} == {"editeval", "humaneval"} and len(mixed) == 6


# --- protocol ------------------------------------------------------------------------------

def test_plan_interleaves_configurations():
    order = [(w.repeat, w.concurrency, w.prompts, w.config) for w in plan(3, ["A", "B"], 2, (1, 2))]
    assert order[:6] == [(0, 1, (0,), "A"), (0, 1, (0,), "B"), (0, 1, (1,), "B"), (0, 1, (1,), "A"),
                         (0, 1, (2,), "A"), (0, 1, (2,), "B")]  # each group starts one configuration later
    assert order[6:10] == [(0, 2, (0, 1), "A"), (0, 2, (0, 1), "B"), (0, 2, (2,), "B"), (0, 2, (2,), "A")]
    assert len(order) == 2 * (6 + 4) and order[10][0] == 1
    three = [w.config for w in plan(4, ["A", "B", "C"], 1, (1,))]
    assert three == list("ABC" "BCA" "CAB" "ABC")  # every configuration in every position


def test_run_writes_interleaved_records_and_conditions(tmp_path):
    cfg = config(tmp_path, repeats=2, warmup=2)
    path = run_bench(cfg, engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    recs = requests(path)
    assert len(recs) == 2 * 4 * 3  # warm-up requests are not recorded
    assert [r["config"] for r in recs[:6]] == ["plain", "ngram:2", "ngram:4", "ngram:2", "ngram:4", "plain"]
    assert [r["prompt_id"] for r in recs[:6]] == ["p0"] * 3 + ["p1"] * 3
    assert [r["order"] for r in recs] == list(range(len(recs)))
    assert len({r["key"] for r in recs}) == len(recs)
    lines = [json.loads(line) for line in open(path)]
    assert lines[0]["kind"] == "meta" and lines[0]["conditions"]["max_tokens"] == 12
    assert lines[1]["kind"] == "session" and "torch" in lines[1]["environment"]["packages"]
    r = recs[0]
    assert r["emitted_tokens"] == 12 == len(r["token_ids"]) and r["bucket"] == "<8"
    assert r["ttft_s"] > 0 and r["e2e_s"] >= r["chunk_times_s"][-1] and r["rss_peak_bytes"] >= r["rss_start_bytes"]
    assert r["itl_s"] == pytest.approx(np.diff(r["chunk_times_s"]).tolist())
    assert all(0 <= r["queue_s"] < 0.1 for r in recs)  # a group's requests arrive as it starts


def test_a_prompt_cache_serves_the_repeats_not_the_warm_up(tmp_path):
    runner, tok = CycleRunner(), CharTokenizer()
    engines = {"plain": Engine(runner, tok, prompt_cache_bytes=1 << 20),
               "ngram:4": Engine(runner, tok, NgramDrafter(1, 3), 4, prompt_cache_bytes=1 << 20)}
    path = run_bench(config(tmp_path, configs=("plain", "ngram:4"), repeats=2, prompt_cache_mb=1), engines=engines,
                     tokenizer=tok, progress=False)
    recs = requests(path)
    # the first repeat prefills every prompt (p0 was the warm-up's, forgotten); the second reuses each
    assert [r["stats"]["cached_tokens"] for r in recs if r["repeat"] == 0] == [0] * 8
    assert [r["stats"]["cached_tokens"] for r in recs if r["repeat"] == 1] == [len(TEXTS[int(r["prompt_id"][1])])
                                                                                for r in recs if r["repeat"] == 1]
    assert json.loads(open(path).readline())["conditions"]["prompt_cache_mb"] == 1


class Interrupt:
    """An engine that raises KeyboardInterrupt on its n-th request, like a Ctrl-C mid-run."""

    def __init__(self, engine, n):
        self.engine, self.n, self.calls = engine, n, 0
        self.target, self.tokenizer, self.drafter = engine.target, engine.tokenizer, engine.drafter
        self.num_draft_tokens, self.scheduler, self.request = engine.num_draft_tokens, engine.scheduler, engine.request

    def run_batch(self, reqs):
        self.calls += 1
        if self.calls == self.n:
            raise KeyboardInterrupt
        return self.engine.run_batch(reqs)


def test_interrupted_run_resumes_without_repeating(tmp_path):
    cfg = config(tmp_path)
    eng = fake_engines()
    eng["ngram:4"] = Interrupt(eng["ngram:4"], 4)  # warm-up is call 1: dies on prompt p2, which it starts
    with pytest.raises(KeyboardInterrupt):
        run_bench(cfg, engines=eng, tokenizer=CharTokenizer(), progress=False)
    first = requests(tmp_path / "out" / REQUESTS)
    assert len(first) == 6 and first[-1]["config"] == "plain" and first[-1]["prompt_id"] == "p1"
    path = run_bench(cfg, engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    recs = requests(path)
    assert len(recs) == 12 and len({r["key"] for r in recs}) == 12
    assert recs[:6] == first  # kept as measured
    assert (recs[6]["prompt_id"], recs[6]["config"]) == ("p2", "ngram:4")
    assert [r["order"] for r in recs] == list(range(12))
    run_bench(cfg, engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)  # nothing left to do
    assert len(requests(path)) == 12
    more = config(tmp_path, repeats=2)  # a plan may grow: the conditions are the same
    assert len(requests(run_bench(more, engines=fake_engines(), tokenizer=CharTokenizer(), progress=False))) == 24


def test_resume_refuses_other_conditions(tmp_path):
    run_bench(config(tmp_path), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    with pytest.raises(ValueError, match="max_tokens"):
        run_bench(config(tmp_path, max_tokens=13), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)


def test_an_archived_run_is_read_from_its_gzip_and_not_written_into(tmp_path):
    import gzip

    cfg = config(tmp_path, configs=("plain",))
    path = run_bench(cfg, engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    before = Results.load(path.parent)
    path.with_suffix(".jsonl.gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    after = Results.load(path.parent)
    assert len(after.requests) == 4 and after.requests == before.requests and after.meta == before.meta
    with pytest.raises(ValueError, match="archived run"):
        run_bench(cfg, engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    cfg = config(tmp_path, configs=("plain",))
    path = run_bench(cfg, engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:40])  # killed mid-write
    assert len(Results.load(path).requests) == 3
    run_bench(cfg, engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    assert len(requests(path)) == 4  # the torn request measured again, the file whole


def test_configurations_must_share_the_target(tmp_path):
    eng = fake_engines()
    eng["ngram:4"] = Engine(CycleRunner(), CharTokenizer(), NgramDrafter(1, 3), 4)
    with pytest.raises(ValueError, match="share one target"):
        run_bench(config(tmp_path), engines=eng, tokenizer=CharTokenizer(), progress=False)


def test_build_engines_loads_target_and_draft_once(monkeypatch):
    import draftwise.build
    from draftwise.bench.engines import build_engines

    loads = []

    def fake_load(spec, backend, threads, max_context, **kw):
        loads.append((spec, backend, threads))
        return CycleRunner(), CharTokenizer()

    monkeypatch.setattr(draftwise.build, "load_runner", fake_load)
    # the draft's vocabulary is checked before its weights load: its tokenizer, by name
    monkeypatch.setattr(draftwise.build, "resolve", lambda spec: spec)
    monkeypatch.setattr(draftwise.build, "load_tokenizer", lambda src: CharTokenizer())
    cfg = BenchConfig(target="t", draft_model="d", backend="torch", threads=3,
                      configs=("plain", "ngram:4", "model:2,4"))
    eng = build_engines(cfg)
    assert loads == [("t", "torch", 3), ("d", "torch", 3)]
    assert len({id(e.target) for e in eng.values()}) == 1 and eng["plain"].drafter is None
    assert eng["model:2"].drafter is not eng["model:4"].drafter  # own request state each...
    assert eng["model:2"].drafter.runner is eng["model:4"].drafter.runner  # ...over one draft model
    assert (eng["ngram:4"].num_draft_tokens, eng["model:4"].num_draft_tokens) == (4, 4)


def test_prompts_that_do_not_fit_are_left_out_for_every_configuration(tmp_path):
    cfg = config(tmp_path, max_tokens=500)  # CycleRunner holds 512 tokens: with D=4 only prompts of <= 8 tokens fit
    path = run_bench(cfg, engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    assert {r["prompt_id"] for r in requests(path)} == {"p0", "p3"}
    session = [json.loads(x) for x in open(path)][1]
    assert session["skipped_prompts"] == ["p1", "p2"]


def test_concurrent_requests_run_batched_in_process(tmp_path):
    cfg = config(tmp_path, concurrency=(1, 2), configs=("plain", "ngram:4"))
    engines = fake_engines()
    runner = engines["plain"].target
    path = run_bench(cfg, engines=engines, tokenizer=CharTokenizer(), progress=False)
    recs = requests(path)
    c1, c2 = [r for r in recs if r["concurrency"] == 1], [r for r in recs if r["concurrency"] == 2]
    assert not any(r["sequential"] for r in recs)
    assert max(map(len, runner.forwards)) == 2  # one target forward carried both requests of a group
    by_key = {(r["config"], r["prompt_id"]): r for r in c2}
    first, second = by_key["plain", "p0"], by_key["plain", "p1"]
    assert second["queue_s"] < first["e2e_s"] and second["ttft_s"] < first["e2e_s"]  # they overlapped
    assert {(r["config"], r["prompt_id"]): r["token_ids"] for r in c1} == \
        {k: r["token_ids"] for k, r in by_key.items()}  # the same greedy outputs, alone or batched
    s = summarise(path)
    assert not any(r.sequential for r in s.rows)


def test_kv_bytes_are_probed_when_the_runner_reports_them(tmp_path):
    class KvRunner(CycleRunner):
        def kv_bytes(self):
            return 100 * sum(len(s) for s in self.seqs.values())

    path = run_bench(config(tmp_path, configs=("plain",)), engines=fake_engines(KvRunner()),
                     tokenizer=CharTokenizer(), progress=False)
    r = requests(path)[0]  # 7 prompt tokens + 12 emitted; the KV holds all but the last
    assert r["kv_peak_bytes"] == 100 * (7 + 12 - 2) and r["probe_s"] > 0
    assert 0 < summarise(path).rows[0].probe_share < 1


# --- statistics ----------------------------------------------------------------------------

def test_percentiles_interpolate_linearly():
    v = list(range(1, 101))
    assert percentile(v, 50) == 50.5 and percentile(v, 95) == pytest.approx(95.05)
    assert percentile(v, 99) == pytest.approx(99.01) and percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([], 50) is None
    lat = Latency.of([0.3, None, 0.1, 0.2])
    assert (lat.n, lat.mean, lat.p50) == (3, pytest.approx(0.2), pytest.approx(0.2))


def test_timing_fields():
    t = timing_fields([0.5, 0.7, 1.2], 1.3)
    assert t["ttft_s"] == 0.5 and t["itl_s"] == pytest.approx([0.2, 0.5]) and t["e2e_s"] == 1.3
    assert timing_fields([], 0.1)["ttft_s"] is None


def test_bootstrap_speedup_is_a_ratio_of_sums():
    # base: 2 s for 1 token, 3 s for 3; cfg: 1 s for 1, 2 s for 1. Ratio of sums (5/4) / (3/2) = 0.833,
    # where the mean of per-prompt ratios (2, 0.5) is 1.25, ignoring tokens 1.67, mean ms/token 1.0
    point, lo, hi = bootstrap_ratio([2, 3], [1, 3], [1, 2], [1, 1])
    assert point == pytest.approx((5 / 4) / (3 / 2))
    # a resample of one prompt twice gives that prompt's ratio: (4/2)/(2/2) = 2 or (6/6)/(4/2) = 0.5,
    # each about a quarter of the resamples, so the 2.5th and 97.5th percentiles are exactly those
    assert (lo, hi) == (pytest.approx(0.5), pytest.approx(2.0))


def test_bootstrap_interval_exact_when_every_prompt_agrees():
    point, lo, hi = bootstrap_ratio([2.0] * 10, [10] * 10, [1.0] * 10, [10] * 10)
    assert point == lo == hi == pytest.approx(2.0)


def test_bootstrap_interval_holds_1_for_noise_and_not_for_a_real_difference():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.5, 1.5, 40)
    noise = base * rng.uniform(0.8, 1.25, 40)  # no systematic difference
    _, lo, hi = bootstrap_ratio(base, [1] * 40, noise, [1] * 40)
    assert lo < 1.0 < hi and in_noise(lo, hi)
    _, lo, hi = bootstrap_ratio(base, [1] * 40, base / 1.5 * rng.uniform(0.9, 1.1, 40), [1] * 40)
    assert 1.0 < lo < 1.5 < hi and not in_noise(lo, hi)


def test_bootstrap_interval_narrows_as_prompts_grow():
    rng = np.random.default_rng(1)
    widths = []
    for n in (10, 100, 1000):
        base = rng.uniform(0.5, 1.5, n)
        _, lo, hi = bootstrap_ratio(base, [1] * n, base / 1.3 * rng.uniform(0.7, 1.3, n), [1] * n)
        widths.append(hi - lo)
    assert widths[0] > 2 * widths[1] > 4 * widths[2]


def test_one_prompt_has_no_interval():
    assert bootstrap_ratio([2.0], [4], [1.0], [4]) == (2.0, None, None)


def test_break_even_interpolates_the_first_crossing():
    assert break_even([(1, 2.0), (2, 1.5), (4, 0.5), (8, 0.4)]) == pytest.approx(3.0)
    assert break_even([(4, 0.5), (1, 1.2), (2, 1.1)]) == pytest.approx(2 + 0.1 * 2 / 0.6)
    assert break_even([(1, 2.0), (8, 1.1)]) is None
    assert draft_length("ngram:8") == ("ngram", 8) and draft_length("plain") is None


def test_summary_metrics_per_configuration_category_and_bucket(tmp_path):
    path = run_bench(config(tmp_path, repeats=2), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    s = summarise(path, n_boot=200)
    scopes = {r.scope for r in s.rows}
    assert scopes == {"all", "category:even", "category:odd", "bucket:<8", "bucket:>=8", "repeat:0", "repeat:1"}
    rows = {r.config: r for r in s.rows if r.scope == "all"}
    assert set(rows) == {"plain", "ngram:2", "ngram:4"}
    plain, ng = rows["plain"], rows["ngram:4"]
    assert plain.requests == 8 and plain.prompts == 4 and plain.emitted_tokens == 8 * 12
    assert plain.acceptance_rate is None and ng.acceptance_rate == 1.0  # the cycle is always right
    # 12 tokens: the prefill's, two rounds of 4 accepted + 1, a plain step (one token left: no draft)
    assert ng.acceptance_length == 5.0 and ng.per_position_acceptance == [1.0] * 4
    assert ng.speedup is not None and ng.speedup_lo <= ng.speedup <= ng.speedup_hi
    assert plain.speedup == 1.0 and plain.speedup_lo is None
    assert plain.e2e.n == 8 and plain.itl.n == 8 * 11 and plain.ms_per_token > 0
    assert plain.e2e.p50 <= plain.e2e.p95 <= plain.e2e.p99
    assert ng.step_ms["draft"] > 10 * plain.step_ms["draft"]  # plain times only an empty propose
    assert len(plain.cdf["e2e_s"]) == 101 and s.checked == 8 * 2 + 4 and not s.mismatches
    jpath, cpath = s.save(tmp_path / "sum")
    assert json.loads(jpath.read_text())["rows"][0]["config"] == "plain"
    lines = cpath.read_text().splitlines()
    assert lines[0].startswith("scope,config,concurrency") and len(lines) == 1 + len(s.rows)
    table = format_table(s)
    assert "1 (baseline)" in table and "ngram:4" in table


def test_decode_speedup_is_the_time_per_output_token_after_the_first():
    """Hand-built requests: both configurations read each prompt in 1 s, then the speculative one
    emits its 10 tokens after the first in half the time. End to end 2.0 s against 1.5 s (1.33x);
    after the first token exactly 2x, on every prompt (so the interval is the point)."""
    from draftwise.bench.summary import _row

    def rec(config, prompt, per_token):
        return {"config": config, "prompt_id": prompt, "repeat": 0, "group": prompt, "ttft_s": 1.0,
                "e2e_s": 1.0 + 10 * per_token, "emitted_tokens": 11, "itl_s": [per_token] * 10}

    base = [rec("plain", p, 0.1) for p in ("a", "b", "c")]
    spec = [rec("ngram:4", p, 0.05) for p in ("a", "b", "c")]
    row = _row("all", "ngram:4", 1, spec, base, [], {}, 0, 200, 0)
    assert row.speedup == pytest.approx(2.0 / 1.5)
    assert row.decode_speedup == row.decode_speedup_lo == row.decode_speedup_hi == pytest.approx(2.0)
    assert _row("all", "plain", 1, base, base, [], {}, 0, 200, 0).decode_speedup == 1.0


# --- output check --------------------------------------------------------------------------

class SevenDrafter(CheapDrafter):
    name = "seven"

    def propose(self, key, ctx, n, params, gen, stop=None):
        return Proposal([7] * n)


def accept_all(logits, prop, params, gen, masks=None):
    d = len(prop.tokens)
    return VerifyResult(prop.tokens + [int(logits[d].argmax())], d, d), None


class AcceptAllScheduler(Scheduler):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.verifier.rule = accept_all  # instead of the acceptance rule (Verifier.rule)


class AcceptAll(Engine):
    """A broken engine: keeps every draft token, so its output leaves the target's."""
    scheduler_class = AcceptAllScheduler


def test_mismatches_are_counted_and_summarised(tmp_path):
    eng = fake_engines(extra={"ngram:2": lambda r, t: AcceptAll(r, t, SevenDrafter(), 2)})
    path = run_bench(config(tmp_path), engines=eng, tokenizer=CharTokenizer(), progress=False)
    s = summarise(path)
    bad = [m for m in s.mismatches]
    assert len(bad) == 4 and {m.config for m in bad} == {"ngram:2"}  # every prompt, only the broken one
    m = bad[0]
    assert (m.unit, m.position, m.other) == ("token", 1, 7)  # the first token comes from prefill
    assert m.margin_single == pytest.approx(8.0) and m.margin_batched == pytest.approx(8.0)  # CycleRunner's
    assert {r.config: r.mismatches for r in s.rows if r.scope == "all"} == {"plain": 0, "ngram:2": 4, "ngram:4": 0}
    line = "output check: 4 of 8 outputs DIFFER from the baseline (plain): 0 at near-ties (top-2 margin ≤ 0.5), " \
        "4 with a larger margin; largest margin 8"
    assert check_text(s) == line
    page = write_report(s, tmp_path / "report.html").read_text()
    assert page.index("<h2>Speedup") < page.index("Output check") < page.index("<h2>Results")
    assert html.escape(line) in page and '<p class="bad">' in page  # a margin of 8 is no near-tie: a bug
    assert "<details id=\"divergences\"><summary>The 4 divergences" in page  # closed: no `open`
    assert "<tr><td>ngram:2</td><td>1</td><td>4</td><td>0</td><td>4</td><td>0</td><td>8</td></tr>" in page


def test_near_ties_are_judged_by_the_smaller_margin():
    def m(single, batched):
        return Mismatch("p", "c", 0, 1, "token", 3, 1, 2, "k", "r", single, batched)

    s = Summary({}, {}, [], "plain", 10, [m(0.1, 0.3), m(0.9, 0.2), m(0.7, None), m(None, None)], [])
    assert check_text(s) == ("output check: 4 of 10 outputs DIFFER from the baseline (plain): 2 at near-ties "
                             "(top-2 margin ≤ 0.5), 1 with a larger margin, 1 without a margin; largest margin 0.7")


def test_baseline_nondeterminism_is_a_mismatch_too():
    recs = [{"key": str(i), "prompt_id": "p", "config": "plain", "repeat": i, "concurrency": 1, "order": i,
             "token_ids": ids} for i, ids in enumerate([[1, 2, 3], [1, 2, 3], [1, 2, 4]])]
    mism, checked = find_mismatches(recs, "plain")
    assert checked == 2 and [(m.repeat, m.position, m.baseline, m.other) for m in mism] == [(2, 2, 3, 4)]


def test_a_row_on_another_backend_is_checked_against_plain_decoding_there():
    """plain@onnx (a converted model) differs from llama.cpp plain at token 1; ngram:4@onnx equals
    plain@onnx, so it is exact; ngram:4 on the baseline's backend is still checked against the
    baseline, and a backend without its own plain row falls back to the baseline."""
    def rec(key, config, ids):
        return {"key": key, "prompt_id": "p", "config": config, "repeat": 0, "concurrency": 1, "order": len(key),
                "token_ids": ids}

    recs = [rec("a", "plain", [1, 2, 3]), rec("bb", "plain@onnx", [1, 5, 6]), rec("ccc", "ngram:4@onnx", [1, 5, 6]),
            rec("dddd", "ngram:4", [1, 2, 3]), rec("eeeee", "ngram:4@torch", [1, 5, 6])]
    mism, checked = find_mismatches(recs, "plain")
    assert checked == 4 and [(m.config, m.reference_key, m.position) for m in mism] == [
        ("plain@onnx", "a", 1), ("ngram:4@torch", "a", 1)]
    recs[2]["token_ids"] = [1, 5, 7]  # a speculative row unlike its own backend's plain decoding
    assert [(m.config, m.reference_key, m.position) for m in find_mismatches(recs, "plain")[0]][1] == ("ngram:4@onnx", "bb", 2)
    s = Summary({}, {}, [], "plain", 4, [], [SimpleNamespace(config=c) for c in ("plain", "plain@onnx", "ngram:4@onnx")])
    assert check_text(s) == "output check: all 4 outputs identical to the baseline (plain; rows on another backend: its plain, plain@onnx)"


def test_text_outputs_are_compared_by_character():
    recs = [{"key": "a", "prompt_id": "p", "config": "plain", "repeat": 0, "concurrency": 1, "text": "hello"},
            {"key": "b", "prompt_id": "p", "config": "srv", "repeat": 0, "concurrency": 1, "text": "help"}]
    mism, _ = find_mismatches(recs, "plain")
    assert [(m.unit, m.position, m.baseline, m.other) for m in mism] == [("char", 3, "l", "p")]


def test_a_server_whose_logprobs_cover_part_of_its_output_is_compared_by_text():
    """llama-server with a draft model returns the first token's logprobs only."""
    ref = {"key": "a", "prompt_id": "p", "config": "plain", "repeat": 0, "concurrency": 1, "text": "def f(): pass",
           "tokens": ["def", " f", "():", " pass"], "emitted_tokens": 4}
    same = {**ref, "key": "b", "config": "draft", "tokens": ["def"]}
    assert find_mismatches([ref, same], "plain") == ([], 1)
    other = {**same, "key": "c", "text": "def g(): pass"}
    assert [(m.unit, m.position) for m in find_mismatches([ref, other], "plain")[0]] == [("char", 4)]


def test_tool_call_answers_are_compared_by_their_calls():
    """A server's answer given as tool calls has empty text: its calls are what is compared."""
    call = {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}
    ref = {"key": "a", "prompt_id": "p", "config": "plain", "repeat": 0, "concurrency": 1, "text": "",
           "tool_calls": [call]}
    relaid = {**ref, "key": "b", "config": "srv",  # the same call in another layout
              "tool_calls": [{"name": "get_weather", "arguments": '{"unit":"C","city":"Paris"}'}]}
    other = {**ref, "key": "c", "config": "srv2", "tool_calls": [{**call, "arguments": '{"city": "Rome", "unit": "C"}'}]}
    none = {**ref, "key": "d", "config": "srv3", "tool_calls": []}
    mism, checked = find_mismatches([ref, relaid, other, none], "plain")
    assert checked == 3 and [(m.config, m.unit) for m in mism] == [("srv2", "char"), ("srv3", "char")]


def test_sampling_runs_skip_the_check(tmp_path):
    path = run_bench(config(tmp_path, temperature=0.8, configs=("plain", "ngram:4")), engines=fake_engines(),
                     tokenizer=CharTokenizer(), progress=False)
    s = summarise(path)
    assert s.checked is None and s.mismatches == []
    assert "not done" in write_report(s, tmp_path / "r.html").read_text()


def test_report_embeds_plots(tmp_path):
    pytest.importorskip("matplotlib")
    path = run_bench(config(tmp_path, concurrency=(1, 2)), engines=fake_engines(), tokenizer=CharTokenizer(),
                     progress=False)
    page = write_report(summarise(path), tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 6  # speedup; vs D, CDFs, per position, time split, concurrency
    assert page.index('id="speedup-chart"') < page.index("Output check")
    assert "src=\"http" not in page  # self-contained


def test_report_cells_hold_no_lists_or_json(tmp_path):
    path = run_bench(config(tmp_path), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    s = summarise(path, n_boot=50)
    ng = next(r for r in s.rows if r.scope == "all" and r.config == "ngram:4")
    page = write_report(s, tmp_path / "report.html").read_text()
    assert page.count('<svg class="spark"') == 2  # per-position acceptance of ngram:2 and ngram:4, drawn
    assert f"{ng.per_position_acceptance[0]:.2f} → {ng.per_position_acceptance[-1]:.2f} over" in page
    assert json.dumps([round(a, 3) for a in ng.per_position_acceptance]) not in page  # the old list repr
    assert "&quot;" not in page and "{" not in page.partition("</style>")[2]  # nor JSON strings or objects
    assert "<tr><td>temperature</td><td>0</td></tr>" in page and "<td>context_edges</td><td>8</td>" in page


def test_report_without_matplotlib_says_which_extra(tmp_path, monkeypatch):
    path = run_bench(config(tmp_path), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    page = write_report(summarise(path, n_boot=50, goal="speedup>=1"), tmp_path / "report.html").read_text()
    assert page.count("pip install 'draftwise[bench]'") == 1  # one line, where the speedup chart would be
    assert "<img" not in page and page.index("<h2>Verdict") < page.index("<h2>Output check") < page.index("<h2>Results")


# --- command line --------------------------------------------------------------------------

def test_cli_bench_report_only(tmp_path, capsys):
    from draftwise import cli

    out = tmp_path / "out"
    run_bench(config(tmp_path), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    assert cli.main(["bench", "--report-only", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("output check: all 8 outputs identical") and "ngram:4" in text
    assert all((out / f).is_file() for f in ("summary.json", "summary.csv", "report.html"))
    from draftwise.cli_harness import _endpoints
    assert _endpoints(["http://a:1/v1", "eagle=http://b:2", "http://c/x?a=b"]) == \
        {"endpoint": "http://a:1/v1", "eagle": "http://b:2", "endpoint3": "http://c/x?a=b"}
    assert cli.main(["bench", "--configs", "plain", "eagle:4", "--out", str(out)]) == 2  # one clear error line


def test_each_runner_declares_its_weights_and_kernels(tmp_path):
    """What a run records of its target (precision, kernels, weight bytes), as each runner declares
    it: a torch runner's linear kernels (mode and padding, so a resumed run cannot mix padded and
    unpadded forwards; stock torch none), llama.cpp's kernel set and GGUF file."""
    from draftwise.backends.base import Weights
    from draftwise.backends.llama_runner import LlamaRunner
    from draftwise.backends.torch_runner import TorchRunner

    lin = torch.nn.Linear(4, 2).to(torch.bfloat16)  # 10 parameters of 2 bytes
    torch_runner = lambda packed, pad: SimpleNamespace(model=lin, packed=packed, pad=pad)  # noqa: E731
    assert TorchRunner.weights(torch_runner("onednn", (0, 6, 6))) == Weights(20, "bfloat16", "onednn, pad [0, 6, 6]")
    assert TorchRunner.weights(torch_runner("onednn", ())).kernels == "onednn"
    assert TorchRunner.weights(torch_runner("off", ())).kernels is None
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x" * 7)
    assert LlamaRunner.weights(SimpleNamespace(model_path=str(gguf), fast_kernels=True)) == Weights(7, "gguf:m.gguf", "repacked")


def test_the_onnx_runner_declares_its_model_files(tmp_path):
    """onnx's weights are the graph and its external data, not the runtime's config (the onnx extra)."""
    pytest.importorskip("onnxruntime_genai", reason="the onnx extra: pip install -e '.[onnx]'")
    from draftwise.backends.base import Weights
    from draftwise.backends.ort_runner import OrtRunner

    (tmp_path / "onnx").mkdir()
    for name, size in (("model.onnx", 3), ("model.onnx.data", 40), ("genai_config.json", 5)):
        (tmp_path / "onnx" / name).write_bytes(b"x" * size)
    ort = SimpleNamespace(model_dir=tmp_path / "onnx", model_path=str(tmp_path / "onnx" / "model.onnx"))
    assert OrtRunner.weights(ort) == Weights(43, "onnx:onnx")  # the graph and its data, not the config


def test_cli_bench_goal_reaches_the_printed_table_and_the_summary(tmp_path, capsys):
    from draftwise import cli

    out = tmp_path / "out"
    run_bench(config(tmp_path), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    assert cli.main(["bench", "--report-only", "--out", str(out), "--goal", "speedup>=0.01,mismatches<=0"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    head = lines.index("goal: speedup>=0.01,mismatches<=0")
    assert head < next(i for i, line in enumerate(lines) if line.startswith("config "))  # verdicts above the table
    assert lines[head + 1].split() == ["plain", "baseline"]
    assert lines[head + 2].startswith("  ngram:2  keep (speedup ") and "mismatches 0 ≤ 0" in lines[head + 2]
    table = {line.split()[0]: line for line in lines if line.startswith(("plain ", "ngram:"))}
    assert table["plain"].endswith("baseline") and table["ngram:4"].endswith(("keep", "uncertain"))
    saved = json.loads((out / "summary.json").read_text())
    assert saved["goal"] == "speedup>=0.01,mismatches<=0"
    assert {r["config"]: r["verdict"]["keep"] for r in saved["rows"] if r["scope"] == "all"} == \
        {"plain": None, "ngram:2": True, "ngram:4": True}
    page = (out / "report.html").read_text()
    assert page.index("<h2>Verdict") < page.index("<h2>Speedup") < page.index("Output check") < page.index("<h2>Results")

    assert cli.main(["bench", "--report-only", "--out", str(out), "--goal", "speedup>=100"]) == 0
    assert "ngram:4  don't keep (speedup " in capsys.readouterr().out  # judged again, nothing rerun
    assert cli.main(["bench", "--report-only", "--out", str(out), "--goal", "latency<=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("draftwise: error: goal part 'latency<=1': unknown metric 'latency'") and "itl_p95" in err
    assert cli.main(["bench", "--report-only", "--out", str(out)]) == 0
    assert "goal:" not in capsys.readouterr().out and json.loads((out / "summary.json").read_text())["goal"] is None


def test_a_goal_is_not_a_condition_of_the_measurements(tmp_path):
    run_bench(config(tmp_path, goal="speedup>=1.1"), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    path = run_bench(config(tmp_path, goal="itl_p95<=1", repeats=2), engines=fake_engines(),
                     tokenizer=CharTokenizer(), progress=False)  # resumes: judging changed, measuring did not
    assert len(requests(path)) == 2 * 12 and "goal" not in json.loads(path.read_text().splitlines()[0])["conditions"]
    with pytest.raises(ValueError, match="unknown metric 'speed'"):
        config(tmp_path, goal="speed>=1.1")  # refused before anything is measured


def test_step_time_split_as_columns_in_csv_and_html(tmp_path):
    path = run_bench(config(tmp_path), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    s = summarise(path, n_boot=50)
    _, cpath = s.save(tmp_path / "sum")
    import csv
    rows = list(csv.DictReader(cpath.open()))
    ng = next(r for r in rows if r["scope"] == "all" and r["config"] == "ngram:4")
    step = next(r for r in s.rows if r.scope == "all" and r.config == "ngram:4").step_ms
    assert float(ng["draft_ms"]) == pytest.approx(step["draft"]) and float(ng["verify_ms"]) == pytest.approx(
        step["verify"])
    assert float(ng["other_ms"]) == pytest.approx(step["other"])
    assert float(ng["prefill_ms"]) == pytest.approx(step["prefill_per_request"]) and int(ng["steps"]) == step["steps"]
    assert ng["verdict"] == ""  # no goal
    page = write_report(s, tmp_path / "report.html").read_text()
    assert "<th>draft ms/step</th><th>verify ms/step</th><th>other ms/step</th>" in page
    assert f"<td>{step['verify']:.2f}</td>" in page and "&quot;prefill_per_request&quot;" not in page


def test_cli_bench_report_only_against_another_configuration(tmp_path, capsys):
    """--report-only --baseline CONFIG re-summarises a finished run against one of its speculative
    configurations: speedups paired per prompt against it (a fake ngram:4 against ngram:2 gives
    the ratio of their ms per token), written beside the run's own summary, which stays as it was."""
    from draftwise import cli

    out = tmp_path / "out"
    run_bench(config(tmp_path), engines=fake_engines(), tokenizer=CharTokenizer(), progress=False)
    assert cli.main(["bench", "--report-only", "--out", str(out)]) == 0
    own = (out / "summary.json").read_text()
    capsys.readouterr()
    assert cli.main(["bench", "--report-only", "--out", str(out), "--baseline", "ngram:2"]) == 0
    text = capsys.readouterr().out
    assert "baseline ngram:2" in text
    vs = json.loads((out / "summary_vs_ngram_2.json").read_text())
    rows = {r["config"]: r for r in vs["rows"] if r["scope"] == "all"}
    mine = {r["config"]: r for r in json.loads(own)["rows"] if r["scope"] == "all"}
    assert vs["baseline"] == "ngram:2" and rows["ngram:2"]["speedup"] == 1.0
    assert rows["ngram:4"]["speedup"] == pytest.approx(mine["ngram:4"]["speedup"] / mine["ngram:2"]["speedup"])
    assert rows["plain"]["speedup"] == pytest.approx(1 / mine["ngram:2"]["speedup"])
    assert (out / "summary.json").read_text() == own and (out / "summary_vs_ngram_2.html").is_file()
    assert cli.main(["bench", "--report-only", "--out", str(out), "--baseline", "model:9"]) == 2
    assert "baseline 'model:9' is not a configuration" in capsys.readouterr().err


def test_a_configuration_may_name_its_backend_and_each_backend_loads_the_target_once(monkeypatch, tmp_path):
    import draftwise.build
    from draftwise.bench.config import RunConfig
    from draftwise.bench.engines import build_engines

    assert RunConfig.parse("ngram:2,auto+prediction@onnx") == [
        RunConfig("ngram:2+prediction@onnx", "ngram", 2, True, "onnx"),
        RunConfig("ngram:auto+prediction@onnx", "ngram", "auto", True, "onnx")]
    with pytest.raises(ValueError, match="one of torch, llama.cpp, onnx"):
        RunConfig.parse("plain@tpu")
    loads = []

    def fake_load(spec, backend, threads, max_context, **kw):
        loads.append((spec, backend))
        runner = CycleRunner(period=5 if backend == "torch" else 4)  # onnx: another model (a conversion)
        runner.backend = backend
        return runner, CharTokenizer()

    monkeypatch.setattr(draftwise.build, "load_runner", fake_load)
    cfg = config(tmp_path, target="t", backend="torch", configs=("plain", "ngram:4", "plain@onnx", "ngram:4@onnx"),
                 max_tokens=8, warmup=0)
    eng = build_engines(cfg)
    assert loads == [("t", "torch"), ("t", "onnx")]  # once per backend, in the order named
    assert eng["plain"].target is eng["ngram:4"].target is not eng["plain@onnx"].target
    assert eng["ngram:4@onnx"].target is eng["plain@onnx"].target and eng["plain@onnx"].target.backend == "onnx"
    path = run_bench(cfg, engines=eng, tokenizer=CharTokenizer(), progress=False)
    recs = requests(path)
    assert {r["config"] for r in recs} == set(eng) and len(recs) == 4 * len(load_prompts(cfg))
    # the output check: plain@onnx against the baseline (the conversion differs), ngram:4@onnx against
    # plain@onnx (exact); no margin replayed across backends
    assert {m.config for m in summarise(path).mismatches} == {"plain@onnx"}
    assert not [r for r in map(json.loads, open(path)) if r["kind"] == "divergence"]
    second = CycleRunner()
    second.backend = "torch"
    eng["ngram:4"] = Engine(second, CharTokenizer(), NgramDrafter(), 4)  # a second torch target
    with pytest.raises(ValueError, match="one target runner per backend"):
        run_bench(cfg, engines=eng, tokenizer=CharTokenizer(), progress=False)
