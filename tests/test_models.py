"""Model registry, loading errors, vocabulary checks, CLI errors."""
import pytest

from draftwise.build import VocabularyMismatch, check_vocabularies
from draftwise.cli import main
from draftwise.models import registry
from draftwise.models.load import load_tokenizer
from draftwise.models.registry import ModelNotFound, ensure_packaged, resolve


def test_packaged_model_is_verified():
    path = ensure_packaged("smollm2-135m")
    assert path.is_file() and registry.sha256_file(path) == registry.PACKAGED["smollm2-135m"].sha256


def test_resolution_errors(tmp_path):
    with pytest.raises(ModelNotFound, match="no-such-model"):
        resolve("no-such-model")
    with pytest.raises(ModelNotFound, match="missing.gguf"):
        resolve(str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelNotFound, match="config.json"):
        resolve(str(tmp_path))
    with pytest.raises(ModelNotFound, match="unknown packaged model"):
        ensure_packaged("gpt-5")


def test_corrupt_file_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    f = tmp_path / "model.gguf"
    f.write_bytes(b"not a model")
    with pytest.raises(ModelNotFound, match="model.gguf is corrupt"):
        registry._verify(f, "0" * 64)
    registry._verify(f, registry.sha256_file(f))  # the right digest passes


def test_vocabulary_check_compares_token_lists():
    smol = load_tokenizer(resolve("smollm2-135m"))
    qwen15 = load_tokenizer(resolve("qwen2.5-coder-1.5b"))
    qwen05 = load_tokenizer(resolve("qwen2.5-coder-0.5b"))
    check_vocabularies(qwen15, qwen05, "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")  # identical lists
    with pytest.raises(VocabularyMismatch, match="smollm2-135m.*qwen2.5-coder-1.5b"):
        check_vocabularies(qwen15, smol, "qwen2.5-coder-1.5b", "smollm2-135m")


def test_cli_reports_bad_input(capsys):
    assert main(["generate", "--target", "/nowhere/model.gguf", "--backend", "torch"]) == 2
    assert "/nowhere/model.gguf does not exist" in capsys.readouterr().err
    assert main(["generate", "--target", "smollm2-135m", "--backend", "torch", "--drafter", "ngram",
                 "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err


@pytest.mark.parametrize("argv,says", [
    (["verify", "--positions", "0"], "--positions: expected an integer >= 1"),
    (["verify", "--samples", "-1"], "--samples: expected an integer >= 1"),
    (["verify", "--prompts", "0"], "--prompts: expected an integer >= 1"),
    (["plan", "--pilot-d", "0"], "--pilot-d: expected an integer >= 1"),
    (["train-head", "--lr", "nan"], "--lr: expected a number > 0"),
    (["train-head", "--answers", "-1"], "--answers: expected an integer >= 0"),
    (["profile", "--threads", "0"], "--threads: expected an integer >= 1"),
    (["serve", "--port", "70000"], "--port: expected a port number 0..65535"),
    (["serve", "--log-level", "bogus"], "--log-level: invalid choice"),
])
def test_cli_refuses_bad_numbers_naming_the_flag(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_cli_refuses_bad_paths_and_workloads_before_loading_a_model(tmp_path, capsys, monkeypatch):
    from draftwise import build

    monkeypatch.setattr(build, "build_engine", lambda *a, **k: pytest.fail("loaded a model"))
    afile, adir = tmp_path / "afile", tmp_path / "adir"
    afile.write_text("x")
    adir.mkdir()
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{bad\n')
    (tmp_path / "num.jsonl").write_text("5\n")
    (tmp_path / "msgs.jsonl").write_text('{"messages": "hello"}\n')
    (tmp_path / "latin.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    one = str(tmp_path / "bad.jsonl")
    cases = [
        (["verify", "--json", str(adir)], f"output file {adir} is a directory"),
        (["verify", "--json", str(tmp_path / "no" / "r.json")], "No such file or directory"),
        (["verify", "--workload", str(tmp_path / "empty.jsonl")], "has no prompts to check"),
        (["verify", "--workload", one], f"{one} line 2: not JSON"),
        (["verify", "--workload", str(tmp_path / "num.jsonl")], "row 0: expected a JSON object, got int"),
        (["verify", "--workload", str(tmp_path / "msgs.jsonl")], "row 0: 'messages' must be a non-empty list"),
        (["verify", "--workload", str(tmp_path / "latin.jsonl")], "latin.jsonl: not UTF-8 text"),
        (["verify", "--workload", str(adir / "d.jsonl")], "No such file"),
        (["bench", "--configs", "plain", "--out", str(afile)], f"output directory {afile} exists and is not a directory"),
        (["plan", "--out", str(afile)], f"output directory {afile} exists and is not a directory"),
        (["serve", "--target", str(tmp_path / "nosuch.gguf")], "nosuch.gguf does not exist"),
        (["bench", "--configs", "plain", "--out", str(afile / "run")], f"{afile} is not a writable directory"),
        (["train-head", "--out", str(afile)], f"output directory {afile} exists and is not a directory"),
        (["profile", "--out", str(adir)], f"output file {adir} is a directory"),
        (["generate", "--max-context", "-5"], "max_context must be >= 1 token, got -5"),
    ]
    for argv, says in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "no").exists() and sorted(p.name for p in adir.iterdir()) == []
    monkeypatch.undo()
    import torch

    if torch.cuda.device_count() < 8:  # refused before the weights load
        assert main(["generate", "--device", "cuda:7", "--backend", "torch", "--target", "smollm2-135m"]) == 2
        assert "device 'cuda:7': torch sees" in capsys.readouterr().err


def test_export_hf_writes_a_directory_transformers_loads_with_the_same_logits(tmp_path, monkeypatch):
    """smollm2-135m exported in float32 gives the logits of the dequantised GGUF load; bad input
    is refused by name."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftwise.models.export import export_hf
    from draftwise.models.load import _hf_args, gguf_parsed_once
    from draftwise.models.registry import resolve

    import gguf

    parsed, reader = [], gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda path, *a: parsed.append(path) or reader(path, *a))
    out = export_hf("smollm2-135m", tmp_path / "hf", dtype="float32")
    assert len(parsed) == 1  # config, weights and vocabulary read from one parse of the file
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    path, kw = _hf_args(resolve("smollm2-135m"))
    with gguf_parsed_once():
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw)
    got = AutoModelForCausalLM.from_pretrained(out)
    assert not hasattr(got.config, "quantization_config") or got.config.quantization_config is None
    ids = AutoTokenizer.from_pretrained(out)("def add(a, b):", return_tensors="pt").input_ids
    with torch.inference_mode():
        assert torch.equal(ref(ids).logits, got(ids).logits)
    with pytest.raises(ValueError, match="not an empty directory"):
        export_hf("smollm2-135m", out)
    with pytest.raises(ValueError, match="unknown dtype"):
        export_hf("smollm2-135m", tmp_path / "x", dtype="int3")


def test_drafter_auto_leaves_out_its_default_draft_model_for_a_target_of_another_family(capsys, monkeypatch):
    """smollm2's vocabulary is not the default draft model's: on the defaults auto runs without the
    model (with a note), whose weights are never loaded (the vocabularies are checked first); a
    model member or draft model the user named is refused as for --drafter model."""
    import draftwise.build as build
    loaded, load_runner = [], build.load_runner
    monkeypatch.setattr(build, "load_runner", lambda spec, *a, **kw: loaded.append(spec) or load_runner(spec, *a, **kw))
    args = ["generate", "--target", "smollm2-135m", "--backend", "llama.cpp", "--prompt", "def add(a, b):",
            "--max-tokens", "6", "--drafter", "auto"]
    assert main(args) == 0
    assert loaded and set(loaded) == {"smollm2-135m"}  # the target only (once per kernel set it compares)
    captured = capsys.readouterr()
    assert "leaving out the default draft model" in captured.err and "emitted_tokens" in captured.out
    assert main(args + ["--auto-members", "suffix,model,ngram"]) == 2
    assert "different token lists" in capsys.readouterr().err


def test_bench_with_drafter_auto_leaves_out_its_default_draft_model_for_a_target_of_another_family(capsys):
    """The bench loads the draft model once for every configuration (build.load_shared): auto's
    default model on smollm2 is left out there too, not refused; a configuration that names the
    model is refused."""
    from draftwise.bench.config import BenchConfig
    from draftwise.bench.engines import build_engines

    cfg = BenchConfig(target="smollm2-135m", backend="llama.cpp", configs=("plain", "auto:auto"))
    engines = build_engines(cfg)
    assert set(engines["auto:auto"].drafter.members) == {"suffix", "prediction"}  # the prediction needs no model
    assert "leaving out the default draft model" in capsys.readouterr().err
    with pytest.raises(VocabularyMismatch):
        build_engines(BenchConfig(target="smollm2-135m", backend="llama.cpp", configs=("plain", "auto:auto", "model:2")))
