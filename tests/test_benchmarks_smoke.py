"""Each driver in benchmarks/ runs end to end on the toy runner of tests/fakes.py or on a tiny saved
input; drivers that need real models run their measuring part on toys and their reading and
table-making part on what that wrote. benchmarks/ is not a package: drivers are loaded by path."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

from draftwise.backends.base import Forward
from draftwise.bench import BenchConfig, run_bench
from draftwise.bench.results import Results
from draftwise.costs import CostCurve
from draftwise.drafters.ngram import NgramDrafter
from draftwise.engine import Engine
from draftwise.peers import GENAI_SERVER, LLAMA_SERVER, OV_PYTHON, VLLM_SERVE
from draftwise.planner import Planner
from draftwise.profile import profile_runner
from draftwise.prompts import Prompt
from fakes import CharTokenizer, CycleRunner
from grammar_fakes import JsonTokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["abcdeab", "cdeabcdea", "eabcdeabcdeab", "bcdeabc"]  # the cycle 0..4: n-gram drafts are right


def driver(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_at_most_ten_drivers_each_with_a_smoke_test():
    drivers = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py"))
    assert len(drivers) <= 10
    tested = Path(__file__).read_text()
    assert all(f'driver("{d}")' in tested for d in drivers), drivers


def test_drivers_import_shared_code_only_from_the_package():
    drivers = {p.stem for p in (ROOT / "benchmarks").glob("*.py")}
    for path in (ROOT / "benchmarks").glob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text, path.name
        for d in drivers:
            assert f"import {d}" not in text and f"from {d} import" not in text, (path.name, d)


@pytest.fixture(scope="module")
def planner_run(tmp_path_factory):
    """A `draftwise bench` run on the toy runner: plain, n-gram auto and fixed D, two categories."""
    tmp = tmp_path_factory.mktemp("planner_run")
    workload = tmp / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "category": "odd" if i % 2 else "even", "prompt": t})
                                + "\n" for i, t in enumerate(TEXTS)))
    runner, tok = CycleRunner(), CharTokenizer()
    auto = Planner(CostCurve({1: [10.0 + 2.0 * k for k in range(17)]}), None, prior=0.6, max_draft=8)
    engines = {"plain": Engine(runner, tok), "ngram:auto": Engine(runner, tok, NgramDrafter(1, 3), "auto", planner=auto),
               "ngram:2": Engine(runner, tok, NgramDrafter(1, 3), 2),
               "ngram:4": Engine(runner, tok, NgramDrafter(1, 3), 4)}
    cfg = BenchConfig(target="fake", workload=str(workload), n_per_category=None,
                      configs=("plain", "ngram:auto", "ngram:2,4"), max_tokens=12, out_dir=str(tmp / "run"))
    run_bench(cfg, engines=engines, tokenizer=tok, progress=False)
    return tmp / "run"


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """Saved `draftwise profile` curves of two toy runners (target, draft)."""
    tmp = tmp_path_factory.mktemp("profiles")
    out = []
    for name, runner in (("target", CycleRunner()), ("draft", CycleRunner())):
        prof = profile_runner(runner, range(1, 5), (1,), context_len=8, repeats=1, warmup=0)
        out.append(str(prof.save(tmp / f"profile_{name}.json")))
    return out


def test_core_measures_checks_and_reports(tmp_path, capsys):
    core = driver("core")
    runner, tok = CycleRunner(), CharTokenizer()
    prompts = [Prompt(f"p{i}", "editeval", text=t) for i, t in enumerate(TEXTS[:2])]

    def other_plain(ids, max_new):  # stands in for transformers' or llama-cpp-python's own decoding
        r = Engine(runner, tok).generate(ids, max_tokens=max_new)
        return r.token_ids[:-1] + [(r.token_ids[-1] + 1) % 5], r.stats.wall_s  # one differing token

    configs = [("lib_plain", other_plain), ("dw_plain", Engine(runner, tok)),
               ("dw_ngram:4", Engine(runner, tok, NgramDrafter(1, 3), 4))]
    plan = [(p, configs) for p in prompts]
    out = tmp_path / "rows.jsonl"
    meta = {"backend": "llama.cpp", "llama_cpp_python": "-", "threads": 1, "machine": "toy", "max_tokens": 8}
    core.warm_up(plan, tok)
    core.measure(out, plan, 8, meta, tok)
    core.measure(out, plan, 8, meta, tok)  # resumed: nothing measured twice
    core.append_divergences(out, runner, tok, {p.id: p for p in prompts})
    assert len(capsys.readouterr().out.splitlines()) == 6  # one progress line per request measured
    rows = [json.loads(line) for line in out.open()]
    assert len([r for r in rows if not r["config"].startswith("divergence:")]) == 6
    md = core.report(out)
    assert "| dw_ngram:4 |" in md and "vs lib_plain" in md and "`dw_ngram:4` stats: proposed" in md
    assert "p0 `lib_plain`: position" in md and "`dw_ngram:4`: position" not in md
    core.main(["report", str(out)])
    assert capsys.readouterr().out.strip() == md.strip()
    a = core.parse_args(["torch", "--ngram-d", "10,auto", "--n", "1", "--no-hf"])
    assert (a.cmd, a.ngram_d, a.n, a.no_hf, a.model_d) == ("torch", "10,auto", 1, True, 4)
    a = core.parse_args(["llama", "--configs", "dw_plain,dw_ngram:15", "--fast-kernels"])
    assert (a.cmd, a.configs, a.fast_kernels, a.workloads) == ("llama", "dw_plain,dw_ngram:15", True, "editeval,prose")


def test_profile_table(profiles, capsys):
    driver("cost_curves").main(["table", *profiles])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| curve | b | k=1 | k=2 | k=3 | k=4 |")
    assert lines[2].startswith("| target | 1 | ") and "(1.00×)" in lines[2] and len(lines) == 4


def test_report_planner_and_step_costs(planner_run, capsys):
    report = driver("report_planner")
    report.main([str(planner_run)])
    out = capsys.readouterr().out
    assert out.startswith("output check: 0 of ") and "### ngram" in out
    assert "| odd |" in out and "| all |" in out and "| category | ngram:2 | ngram:4 |" in out
    report.main([str(planner_run), "--steps", "ngram"])
    out = capsys.readouterr().out
    assert "ms/forward" in out and "ngram:auto steps by draft tokens proposed" in out
    assert any(line.startswith("even") and "ngram:2" in line for line in out.splitlines())
    report.main([str(planner_run), "--decode"])
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"ngram:auto", "ngram:2", "ngram:4"}
    n = len(TEXTS)
    assert all(r[1] == f"{n} of {n}" and 0.0 < float(r[3]) < 1.0 and float(r[4]) > 0 for r in rows.values())
    report.main([str(planner_run), "--against", str(planner_run)])  # a run against itself: new/old is 1
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    assert {r[1].split(" (")[0] for r in rows} == {"ngram:auto", "ngram:2", "ngram:4"}
    assert all(r[2] == r[3] and r[4] == "1.000" for r in rows) and rows[-1][0] == "| all"


def test_report_planner_members_counts_auto_rounds_and_prompt_catch_ups(monkeypatch, capsys):
    report = driver("report_planner")
    # decisions rows: [d, proposed, unseen, predicted ms, measured ms, draft ms, member]
    a = [[0, 0, 0, 10, 10, 0, "none"], [3, 3, 0, 20, 21, 0, "suffix"], [2, 2, 300, 2000, 2500, 5, "model"],
         [2, 2, 2, 30, 31, 5, "model"]]
    b = [[4, 4, 0, 20, 22, 0, "suffix"], [0, 0, 0, 10, 10, 0, "none"]]
    c = [[2, 1, 40, 400, 700, 5, "model"]]
    reqs = [{"config": "auto:auto", "concurrency": 1, "category": cat, "decisions": plans}
            for cat, plans in (("rag", a), ("rag", b), ("qa", c))]
    reqs.append({"config": "suffix:auto", "concurrency": 1, "category": "rag", "decisions": b})  # not auto's
    monkeypatch.setattr(report, "_requests", lambda path: reqs)
    report.main(["run", "--members"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["| auto:auto | all | 3 | 5 | model 3, suffix 2 | 2 | 0.7–2.5 |",
                         "| auto:auto | qa | 1 | 1 | model 1 | 1 | 0.7–0.7 |",
                         "| auto:auto | rag | 2 | 4 | model 2, suffix 2 | 1 | 2.5–2.5 |"]


def test_report_planner_costs_by_prompt_length(monkeypatch, capsys):
    report = driver("report_planner")
    # decisions rows: [d, proposed, unseen, predicted ms, measured ms, draft ms, member]; a catch-up left out
    short = [[0, 0, 0, 10, 10, 0, None], [3, 3, 0, 20, 22, 0, None], [0, 0, 0, 10, 12, 0, None]]
    long = [[2, 2, 0, 40, 60, 0, None], [2, 2, 300, 2000, 9000, 5, None], [0, 0, 0, 10, 10, 0, None]]
    reqs = [{"config": "suffix:auto", "prompt_tokens": n, "decisions": p} for n, p in ((100, short), (700, long))]
    monkeypatch.setattr(report, "_requests", lambda path: reqs)
    report.main(["run", "--costs"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:] == ["| suffix:auto | < 300 | 1, 1.100 | 2, 1.100 |",
                         "| suffix:auto | >= 600 | 1, 1.500 | 1, 1.000 |"]


def test_replay_planner_traces_and_replay(planner_run, profiles, tmp_path, capsys):
    replay = driver("replay_planner")
    traces = tmp_path / "traces.jsonl"
    replay.write_traces(str(planner_run), str(traces), CycleRunner(), CycleRunner(), CharTokenizer())
    rows = [json.loads(line) for line in traces.open()]
    assert len(rows) == len(TEXTS) and all(r["draft_argmax"] == r["tokens"] for r in rows)  # the toys agree
    with pytest.raises(SystemExit):  # the `traces` subcommand reaches its own parser
        replay.main(["traces", "--help"])
    assert "replay_planner.py traces" in capsys.readouterr().out
    res = replay.main([str(traces), *profiles, "--per-request", "--set", "probe_max=1"])  # draft model
    assert set(res) == {"even", "odd"} and all(r["auto"] > 0 for r in res.values())
    out = capsys.readouterr().out
    assert "p0" in out and "catch-ups" in out
    res = replay.main([str(traces), profiles[0], "--margin", "0.05"])  # the n-gram drafter
    assert set(res["odd"]) == {"auto", 2, 4, 8, "oracle"}
    # a drafter with no model on the run's own plain outputs: no traces, the prompts rebuilt
    trs = replay.run_traces(str(planner_run), CharTokenizer())
    assert [t["tokens"] for t in trs] == [t["tokens"] for t in rows] and all(t["prompt_ids"] for t in trs)
    res = replay.replay_run(str(planner_run), profiles[0], drafter="suffix", tok=CharTokenizer())
    assert set(res) == {"even", "odd"} and all(r["oracle"] > 0 and r["auto"] > 0 for r in res.values())


def test_gpu_check_on_the_cpu(tmp_path):
    gpu = driver("gpu_check")
    if gpu.DEVICE != "cpu":
        pytest.skip("a GPU is present: the smoke test is the CPU path")
    gpu.main(["--out", str(tmp_path), "--skip-curves"])
    ex = json.loads((tmp_path / "gpu_exactness.json").read_text())
    assert ex["model:4"]["identical"] and ex["ngram:4"]["identical"] and ex["head:4"]["identical"]
    assert ex["sampling_seeded_repeat"]
    gpu.main(["--engine", "--max-tokens", "6", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "gpu_engine.json").read_text())["summary"]
    assert set(summary) == {"plain", "ngram:4", "ngram:16", "ngram:auto", "model:4", "model:auto", "head:4", "head:auto"}
    assert summary["ngram:4"]["identical"] and summary["head:4"]["identical"]  # fp32 on the CPU: exact
    assert summary["head:4"]["rounds"] > 0


def test_gpu_predict_on_the_saved_curves(capsys):
    data = ROOT / "docs" / "data"
    driver("gpu_predict").main(["--curves", str(data / "gpu_curves_h200.json"),
                                "--rows", str(data / "core_torch_packed.jsonl")])
    out = capsys.readouterr().out
    assert "0.5B draft, HumanEval: alpha_1..4 = [0.95, 0.93, 0.96, 0.92]" in out and "best D=0" in out
    assert "head, humaneval: alpha_1..3 = [0.33, 0.34, 0.27]" in out and "head needs alpha >= " in out


def test_server_bench_commands(capsys, monkeypatch, tmp_path):
    server = driver("server_bench")
    a = server.parse_args(["--configs", "plain", "auto", "8", "--n", "2", "--concurrency", "1", "2", "--port", "9000"])
    servers, bench = server.commands(a)
    assert list(servers) == ["plain", "auto", "D8"]
    assert servers["plain"][-2:] == ["--port", "9000"] and "none" in servers["plain"]
    assert servers["auto"][servers["auto"].index("--num-draft-tokens") + 1] == "auto"
    assert servers["D8"][servers["D8"].index("--num-draft-tokens") + 1] == "8"
    assert servers["plain"][servers["plain"].index("--prompt-cache-mb") + 1] == "0"  # repeats measure prefills
    assert "plain=http://127.0.0.1:9000/v1" in bench and "D8=http://127.0.0.1:9002/v1" in bench
    assert bench[bench.index("--concurrency") + 1: bench.index("--concurrency") + 3] == ["1", "2"]
    assert bench[bench.index("--baseline") + 1] == "plain"
    with pytest.raises(SystemExit, match="expected plain, auto or an integer"):
        server.commands(server.parse_args(["--configs", "plain", "fast"]))
    assert server.main(["--dry-run"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 4
    peer = server.parse_args(["--engine", "llama-server", "--draft-model", "smollm2-135m", "--concurrency", "1", "4"])
    servers, bench = server.commands(peer)
    assert list(servers) == ["plain", "ngram-simple", "ngram-mod", "draft"]
    assert servers["plain"][0] == LLAMA_SERVER and "--metrics" in servers["plain"]
    assert servers["plain"][servers["plain"].index("-np") + 1] == "4"
    assert servers["ngram-mod"][servers["ngram-mod"].index("--spec-type") + 1] == "ngram-mod"
    assert servers["draft"][servers["draft"].index("--spec-draft-model") + 1].endswith(".gguf")
    with pytest.raises(SystemExit, match="expected plain, draft.K. or one of"):
        server.commands(server.parse_args(["--engine", "llama-server", "--configs", "plain", "ngram-fast"]))
    sized = server.commands(server.parse_args(["--engine", "llama-server", "--configs", "plain", "ngram-simple16",
                                               "draft4"]))[0]
    assert sized["ngram-simple16"][-6:] == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "16",
                                            "--port", "8302"]
    assert sized["draft4"][sized["draft4"].index("--spec-draft-n-max") + 1] == "4"
    mixed = server.commands(server.parse_args(["--engine", "llama-server", "--configs", "plain", "draftwise-auto",
                                               "--serve-args", "--spec-draft-p-min 0.5"]))[0]
    assert mixed["draftwise-auto"][mixed["draftwise-auto"].index("--num-draft-tokens") + 1] == "auto"
    assert "serve" in mixed["draftwise-auto"] and "--spec-draft-p-min" not in mixed["draftwise-auto"]
    # beside a peer draftwise keeps its prompt cache, as the peer does (llama-server reuses a slot's KV)
    assert "--prompt-cache-mb" not in mixed["draftwise-auto"] and "--cache-ram" not in mixed["plain"]
    off = server.commands(server.parse_args(["--engine", "llama-server", "--configs", "plain", "draftwise-auto",
                                             "--prompt-cache", "off"]))[0]
    assert off["draftwise-auto"][off["draftwise-auto"].index("--prompt-cache-mb") + 1] == "0"
    assert mixed["plain"][0] == LLAMA_SERVER and "--spec-draft-p-min" in mixed["plain"]
    with pytest.raises(SystemExit, match="ngram-cache.*no draft length"):
        server.commands(server.parse_args(["--engine", "llama-server", "--configs", "plain", "ngram-cache8"]))
    vllm = server.parse_args(["--engine", "vllm", "--model", "qwen2.5-coder-1.5b", "--configs", "plain", "ngram8",
                              "draft", "--concurrency", "1", "4"])
    servers, bench = server.commands(vllm)
    assert servers["plain"][0] == VLLM_SERVE and "--speculative-config" not in servers["plain"]
    assert servers["plain"][servers["plain"].index("--max-num-seqs") + 1] == "4"
    spec = {c: json.loads(servers[c][servers[c].index("--speculative-config") + 1]) for c in ("ngram8", "draft")}
    assert spec["ngram8"] == {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert spec["draft"]["model"].endswith("/qwen2.5-coder-0.5b") and spec["draft"]["num_speculative_tokens"] == 4
    assert "ngram8=http://127.0.0.1:8302/v1" in bench
    with pytest.raises(SystemExit, match="expected plain, ngram"):
        server.commands(server.parse_args(["--engine", "vllm", "--configs", "plain", "eagle"]))
    ov = server.parse_args(["--engine", "openvino", "--model", "qwen2.5-coder-1.5b", "--configs", "draftwise-plain",
                            "plain", "lookup", "draft8", "draftwise-auto@onnx", "--concurrency", "1"])
    servers, bench = server.commands(ov)
    assert list(servers) == ["draftwise-plain", "ov-plain", "ov-lookup", "ov-draft8", "draftwise-auto@onnx"]
    assert servers["ov-plain"][:4] == [OV_PYTHON, GENAI_SERVER, "--runtime", "openvino"]
    assert "--prompt-lookup" not in servers["ov-plain"]
    assert servers["ov-lookup"][-4:] == ["--prompt-lookup", "5", "--port", "8303"]  # OpenVINO's samples' K
    assert servers["ov-draft8"][servers["ov-draft8"].index("--draft-model") + 1] == ".peers/ov/qwen2.5-coder-0.5b"
    assert servers["ov-draft8"][servers["ov-draft8"].index("--draft") + 1] == "8"
    onnx = servers["draftwise-auto@onnx"]
    assert onnx[onnx.index("--backend") + 1] == "onnx" and onnx[onnx.index("--max-running") + 1] == "1"
    assert servers["draftwise-plain"][servers["draftwise-plain"].index("--backend") + 1] == "llama.cpp"
    assert bench[bench.index("--baseline") + 1] == "draftwise-plain" and "ov-lookup=http://127.0.0.1:8303/v1" in bench
    with pytest.raises(SystemExit, match="expected plain, lookup.K. or draft.K."):
        server.commands(server.parse_args(["--engine", "openvino", "--configs", "plain", "ngram"]))
    with pytest.raises(SystemExit, match="may be onnx only"):
        server.commands(server.parse_args(["--engine", "openvino", "--configs", "plain", "draftwise-auto@torch"]))
    import draftwise.models.ort_convert as ort_convert
    ort = server.parse_args(["--engine", "onnx-genai", "--model", "qwen2.5-coder-1.5b", "--configs", "plain", "ngram",
                             "ngram6", "--concurrency", "1"])
    monkeypatch.setattr(ort_convert, "converted_dir", lambda spec: None)
    with pytest.raises(FileNotFoundError, match="not converted for onnx yet.*--backend onnx"):
        server.commands(ort)
    monkeypatch.setattr(ort_convert, "converted_dir", lambda spec: tmp_path)
    servers = server.commands(ort)[0]
    assert list(servers) == ["ort-plain", "ort-ngram", "ort-ngram6"]
    assert servers["ort-plain"][2:6] == ["--runtime", "onnx", "--model", str(tmp_path)]
    assert servers["ort-ngram"][-9:-2] == ["--ngram", "4", "--draft", "8", "--adaptive", "2", "--chained"]  # its docs'
    assert servers["ort-ngram6"][-9:-2] == ["--ngram", "4", "--draft", "6", "--adaptive", "0", "--chained"]  # fixed
    with pytest.raises(SystemExit, match="expected plain or ngram.K."):
        server.commands(server.parse_args(["--engine", "onnx-genai", "--configs", "plain", "lookup"]))


def test_kernels_linear_on_a_small_layer(capsys):
    threads = torch.get_num_threads()
    try:
        driver("kernels").main(["linear", "--in", "32", "--out", "48", "--rows", "3", "--repeats", "2",
                                "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:2] == ["rows", "sgemm"] and len(lines) == 5


def test_kernels_pad_on_a_tiny_model(capsys):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from draftwise.backends import packed_linear
    from draftwise.backends.torch_runner import TorchRunner

    if not packed_linear.onednn_available():
        pytest.skip("no oneDNN in this torch build")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=16))
    runner = TorchRunner(model, pack="onednn")
    driver("kernels").measure(runner, CharTokenizer(), [t % 15 for t in range(40)], max_k=3, repeats=1, decode=4)
    out = capsys.readouterr().out
    assert "# pad from this pass:" in out and "chosen: True" in out


def test_cost_curves_ragged_on_the_toy_runner():
    from draftwise.costs import CostCurve
    from fakes import CycleRunner

    ragged = driver("cost_curves")
    assert ragged.shapes(4)[0] == ("all plain", [1] * 4) and ("one drafts 2", [3, 1, 1, 1]) in ragged.shapes(4)
    curve = CostCurve({b: [10 + k * b for k in range(1, 18)] for b in (1, 2, 4)})
    runner = CycleRunner(period=15)
    rows = ragged.measure(runner, curve, 4, reps=1)
    one = next(r for r in rows if r["shape"] == "one drafts 8")  # CycleRunner splits nothing: padded
    assert one["split_ms"] == one["padded_ms"] == pytest.approx(10 + 9 * 4)
    assert not runner.seqs  # every sequence freed
    assert "median |error| split" in ragged.ragged_table(rows, 4)


class _FeatureRunner(CycleRunner):
    """CycleRunner with target features (the one-hot of its next token) and embedding tables."""
    backend, hidden_size, num_layers, returns_features, features_free = "torch", 16, 2, True, True

    def forward_features(self, seq_ids, tokens, num_logits, layers, parents=None):
        out = super().forward(seq_ids, tokens, num_logits, parents)
        return Forward(out, [torch.nn.functional.one_hot(torch.tensor([(t + 1) % self.period for t in toks]),
                                                         16).float() for toks in tokens])

    def embedding_tables(self):
        eye = torch.eye(16)
        return eye, lambda ids: 8 * eye[ids]


def test_replay_planner_traces_head_mode(planner_run, tmp_path):
    from draftwise.models.head import HeadConfig, new_head, save_head

    runner = _FeatureRunner()
    emb, rows = runner.embedding_tables()
    head = new_head(HeadConfig(16, 2, 2, 8, 16, 16, 16), emb, rows(torch.arange(16)), torch.zeros(16, dtype=torch.long))
    with torch.no_grad():  # out = fc(feature): the feature one-hot(t) -> one-hot(t + 1), the target's next token
        head.fc.weight.copy_(torch.eye(16)[[(t - 1) % runner.period if t < runner.period else t for t in range(16)]])
        head.midlayer.self_attn.o_proj.weight.zero_()
        head.midlayer.mlp.down_proj.weight.zero_()
    save_head(head, tmp_path / "head")
    res = driver("replay_planner").head_acceptance(str(planner_run), str(tmp_path / "tf.json"), runner, CharTokenizer(),
                                                   str(tmp_path / "head"), "fake")
    tf = res["teacher_forced"]
    assert set(tf) == {"odd", "even", "all"} and res["generation"] == {}
    # every output token but the first starts a chain (the head's first draft comes at the second
    # step); step s is scored where the text goes on for s more tokens after the chain's start
    plain = [r for r in Results.load(str(planner_run)).requests.values() if r["config"] == "plain"]
    for cat in ("odd", "even"):
        outs = [len(r["token_ids"]) for r in plain if r["category"] == cat]
        assert tf[cat]["chains"] == [sum(outs) - len(outs) * (s - 1) for s in (1, 2, 3)]
    assert tf["all"]["chains"] == [a + b for a, b in zip(tf["odd"]["chains"], tf["even"]["chains"])]
    hits = [[c * n for c, n in zip(tf[k]["chain"], tf[k]["chains"])] for k in ("odd", "even", "all")]
    assert hits[2] == pytest.approx([a + b for a, b in zip(*hits[:2])])  # the categories partition the chains
    # step 1 reads the target's feature and drafts its next token; step 2 reads its own output
    # unchanged (no fc), which drafts the token it was fed: never the next one
    assert tf["all"]["acceptance_per_position"] == [1.0, 0.0, 0.0]
    assert json.loads((tmp_path / "tf.json").read_text()) == res


def test_cost_curves_trie_builds(capsys):
    import gc

    try:
        driver("cost_curves").main(["trie", "--lengths", "40", "--reps", "1"])
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("prompt tokens") and rows[1].split("|")[0].strip() == "40"
    assert 40 < int(rows[1].split("|")[1]) <= 1 + 24 * 17 + 23 * 24 // 2  # root + substrings of <= 24 tokens


def test_cost_curves_head_costs_on_smollm2(tmp_path, capsys):
    pytest.importorskip("llama_cpp")
    from draftwise.models.head import HeadConfig, new_head, save_head
    from draftwise.models.load import load_runner

    runner, _ = load_runner("smollm2-135m", "llama.cpp", threads=2)
    emb, rows = runner.embedding_tables()
    ids = torch.arange(256)
    c = HeadConfig(runner.hidden_size, 4, 2, 64, 256, runner.vocab_size, 256, [], 1e-6, 10000.0)
    save_head(new_head(c, emb, rows(ids), torch.zeros(256, dtype=torch.long)), tmp_path / "h", dtype=torch.float32)
    driver("cost_curves").main(["head", "--model", "smollm2-135m", "--head", str(tmp_path / "h"),
                                "--prompt-tokens", "40", "--reps", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(":")[0] for ln in lines[1:]] == [
        "head drafted token, float32", "head drafted token, bfloat16",
        "prefill of 40 tokens, 1 output row, embeddings off", "prefill of 40 tokens, 1 output row, embeddings on"]
    assert all(float(ln.split(":")[1]) > 0 for ln in lines[1:])


def test_ort_backend_curves_and_agreement_on_toys():
    ort = driver("ort_backend")
    res = ort.interleaved_curves({"a": CycleRunner(), "b": CycleRunner(period=7)}, repeats=1, context_len=32)
    assert [r["runner"] for r in res["rows"]] == ["a", "b"] and res["rows"][0]["ratio"][1] == 1.0
    assert res["table"].count("\n") == 3 and "T(8)/T(1)" in res["table"]
    prompts = [Prompt("p0", "toy", text="abcdeab"), Prompt("p1", "toy", text="cdeabc")]
    out = ort.agreement(CycleRunner(), CycleRunner(period=7), CharTokenizer(), prompts, max_tokens=8)
    assert out["summary"]["spec_equals_plain"] == 2 and out["summary"]["prompts"] == 2
    assert all(r["onnx_vs_llama_first_divergence"] is not None and "at_divergence" in r for r in out["rows"])


class _ChatJsonTokenizer(JsonTokenizer):
    """grammar_fakes' JSON-piece tokenizer with a chat template: the message's letters it has pieces for."""

    def apply_chat(self, messages):
        return [0] + self.encode("".join(c for c in messages[-1]["content"] if c in "abcxy"))


def test_agents_json_measures_on_toys_and_tables_the_rows(tmp_path, capsys):
    pytest.importorskip("llguidance")
    from draftwise.grammar import Grammars
    from grammar_fakes import PIECES, TableDrafter, TableRunner

    agents = driver("agents")
    tok = _ChatJsonTokenizer()
    pair = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {"type": "boolean"}},
            "required": ["a", "b"], "additionalProperties": False}
    rows = [{"id": f"r{i}", "messages": [{"role": "user", "content": p}], "response_format": {"json_schema": {"schema": pair}}}
            for i, p in enumerate(["abc", "xy ab"])]
    engines = {"plain": Engine(TableRunner(), tok, max_running=1),
               "table": Engine(TableRunner(), tok, TableDrafter(), 4, max_running=1)}
    out = agents.measure(engines, tok, Grammars(tok, len(PIECES)), rows, 40, tmp_path / "run")
    saved = [json.loads(line) for line in out.open()]
    assert [(r["id"], r["config"]) for r in saved] == [("r0", "plain"), ("r0", "table"), ("r1", "plain"), ("r1", "table")]
    assert all(r["valid"] and r["divergence"] is None and r["finish"] == "stop" for r in saved)  # greedy: identical
    assert len(capsys.readouterr().err.splitlines()) == 4  # one progress line per request
    assert agents.main(["json", "--table", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| config | tokens |") and lines[2].startswith("| plain |") and "| 1.00x | 1.00x |" in lines[2]
    assert lines[3].startswith("| table |") and lines[3].endswith("| 2/2 | 2/2 |") and lines[4].startswith("median prompt")
    saved_run = agents.table(ROOT / "docs" / "data" / "agents_json" / "rows.jsonl")  # rows of a real run
    assert [ln.split(" | ")[0] for ln in saved_run.splitlines()[2:5]] == ["| plain", "| ngram", "| suffix"]
    with pytest.raises(SystemExit):
        agents.main(["json", "--help"])
    usage = capsys.readouterr().out
    assert all(f in usage for f in ("--drafters", "--max-tokens", "--kernels", "--limit", "--out", "--table",
                                    "--backends"))


def test_agents_forced_replays_the_three_ways_of_joining_forced_runs():
    """Hand-built answer: a forced run at 1 ({1, 2, 3}), the n-gram's [7, 8] after 3, a forced run at 6
    ({4, 5, 6}); a forward of k tokens costs 10 + k ms. Rounds by hand: separate [1 2 3]+7, [8]+4,
    [5 6]+9 = 14 + 12 + 13; then-draft [1 2 3 7 8]+4, [5 6]+9 = 16 + 13; interleaved, one round of 8
    and the bonus 9 = 19 (against 9 plain steps of 11 ms)."""
    agents = driver("agents")
    out = [100, 1, 2, 3, 7, 8, 4, 5, 6, 9]
    forced = [[], [1, 2, 3], [2, 3], [3], [], [], [4, 5, 6], [5, 6], [6], []]
    table = {3: [7, 8, 0], 7: [8]}
    propose = lambda ctx, n: table.get(ctx[-1], [])[:n]  # noqa: E731
    cost = agents.cost_curve("1:11,16:26")
    assert cost(1) == 11 and cost(8) == 18
    ms = {w: agents.replay(out, [5], forced, w, cost, 8, propose) for w in agents.WAYS}
    assert ms == {"separate": 39, "then-draft": 29, "interleaved": 19}
    assert agents.replay(out, [5], forced, "interleaved", cost, 4, propose) == 15 + 14  # [1 2 3 7]+8, [4 5 6]+9


def test_agents_engines_on_the_toy_tokenizer_skips_a_missing_engine(capsys):
    pytest.importorskip("llguidance")
    from draftwise.grammar import Grammars
    from grammar_fakes import EOS, PIECES

    agents = driver("agents")
    tok = _ChatJsonTokenizer()

    class Hf:  # the part of an HF tokenizer the driver reads
        eos_token_id = EOS

        def encode(self, text, add_special_tokens=False):
            return tok.encode(text)

        def decode(self, ids):
            return tok.decode(ids)

    class ToyLLG(agents.LLG):
        @staticmethod
        def tokenizer(hf, vocab):
            return Grammars(tok, vocab).tok

    class Missing(agents.XGR):
        name = "not-an-engine"

        def __init__(self, hf, vocab):
            raise ImportError("No module named 'not_an_engine'")

    xy = {"type": "object", "properties": {"xy": {"type": "array", "items": {"type": "integer"}}, "c": {"enum": ["ab", "c"]}},
          "required": ["xy", "c"], "additionalProperties": False}
    cases = [("xy", xy, {"xy": [0, 1, 2, 10, 21], "c": "ab"}), ("object", {"type": "object"}, {"a": "b", "c": [1, 2]})]
    features = [("enum", {"enum": ["a", "b"]}, "a", "c"), ("maxLength", {"type": "string", "maxLength": 2}, "ab", "abc"),
                ("not", {"not": {"type": "string"}}, 1, "x")]
    absent = agents.XGR if importlib.util.find_spec("xgrammar") is None else Missing  # xgrammar: not a dependency
    agents.compare(Hf(), len(PIECES), 2, kinds=(ToyLLG, absent), cases=cases, features=features)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("llguidance: tokenizer set-up") and out[1].startswith(f"{absent.name}: not installed, skipped")
    timing = [ln.split(" | ") for ln in out if ln.startswith("| llguidance |")]
    assert [r[1] for r in timing] == ["xy", "object"] and all(float(r[4]) >= 0 for r in timing)
    cov = {ln.split(" | ")[0][2:]: ln.split(" | ")[1].rstrip(" |") for ln in out if ln.startswith("| ") and " | " in ln
           and ln.split(" | ")[0][2:] in ("enum", "maxLength", "not")}
    assert cov["enum"] == cov["maxLength"] == "enforced" and cov["not"].startswith("refused")
    assert out[-5].startswith("| feature | llguidance |") and out[-5].count("|") == 3  # the skipped engine: no column
    with pytest.raises(SystemExit):
        agents.main(["engines", "--help"])
    assert "--repeats" in capsys.readouterr().out
