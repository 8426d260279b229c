"""`draftwise generate` as a user runs it: each drafter on the CLI's defaults (the packaged
Qwen2.5-Coder pair, D = auto, the demo prompt), next to plain decoding."""
import json
import re

import pytest

from draftwise import cli
from draftwise.build import EngineSpec

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "auto"])
def test_generate_each_drafter_on_defaults(drafter, capsys):
    assert cli.main(["generate", "--drafter", drafter, "--max-tokens", "12", "--compare-plain"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"emitted_tokens\s+12", out)
    if drafter == "none":
        assert "speedup" not in out  # nothing to compare with
        return
    label = f"{drafter} D=auto"
    assert label in out
    lines = [line for line in out.splitlines() if line.startswith("speedup")]
    assert lines and all("outputs identical: True" in line for line in lines)  # greedy: plain's tokens
    assert re.search(rf"speedup \(ms per emitted token, plain / {label}\): \d+\.\d+x", out)
    if drafter == "auto":  # its default members, or plain steps
        chosen = re.search(r"steps by drafter chosen: (.*)", out).group(1)
        assert {c.split()[0] for c in chosen.split(", ")} <= {"suffix", "model", "none"}


def test_generate_streams_plain_text_by_default(capsys):
    args = ["generate", "--drafter", "none", "--prompt", "hi", "--max-tokens", "4"]
    assert cli.main(args) == 0
    streamed = capsys.readouterr().out
    assert cli.main(args + ["--json"]) == 0
    text = json.loads(capsys.readouterr().out)["plain"]["text"]
    # the text as it was committed, then the stats table
    assert text.strip() and streamed.startswith(text + "\n") and re.search(r"emitted_tokens\s+4", streamed)


def test_one_set_of_model_defaults():
    parser = cli.build_parser()
    spec = EngineSpec()
    for cmd in (["generate"], ["verify"], ["plan"], ["serve"]):
        a = parser.parse_args(cmd)
        assert (a.target, a.drafter, a.num_draft_tokens, a.draft_model, a.kernels) == \
            (spec.target, spec.drafter, spec.num_draft_tokens, spec.draft_model, "auto")
    a = parser.parse_args(["bench"])
    assert (a.target, a.draft_model, a.kernels) == (spec.target, spec.draft_model, "auto")


def test_device_is_checked_and_reaches_the_torch_loader(capsys):
    from draftwise.build import _backend_kw

    with pytest.raises(ValueError, match="unknown device 'gpu'; expected cpu, cuda or cuda:N"):
        EngineSpec(device="gpu")
    with pytest.raises(ValueError, match="the llama.cpp backend runs on the CPU only"):
        EngineSpec(device="cuda", backend="llama.cpp")
    assert cli.main(["generate", "--backend", "llama.cpp", "--device", "cuda:0", "--max-tokens", "2"]) == 2
    assert "runs on the CPU only" in capsys.readouterr().err
    spec = EngineSpec(device="cuda:1", backend="torch", drafter="model")
    assert _backend_kw("torch", spec) == {"device": "cuda:1"}
    assert _backend_kw("torch", spec, draft=True) == {"device": "cuda:1", "pack": "single"}
    import torch
    if not torch.cuda.is_available():  # the default: the CPU here, and GGUF models on llama.cpp
        assert _backend_kw("torch", EngineSpec(backend="torch")) == {"device": "cpu"}
        assert EngineSpec(device="cpu").backend == EngineSpec().backend == "llama.cpp"


def test_verify_and_plan_run_through_the_cli(tmp_path, capsys):
    small = ["--target", "smollm2-135m", "--drafter", "ngram", "--max-tokens", "16"]
    assert cli.main(["verify", *small, "--temperature", "0", "--prompts", "1", "--num-draft-tokens", "4"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert cli.main(["plan", *small, "--n", "1", "--pilot-tokens", "8", "--workload", "editeval",
                     "--out", str(tmp_path / "plan"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "predicted speedup" in out and "ngram:auto" in out


def test_drafter_auto_members_are_checked_by_name():
    assert EngineSpec(auto_members=("ngram", "model")).auto_members == ("ngram", "model")
    with pytest.raises(ValueError, match="members ngram, medusa: expected distinct names among ngram, suffix, model, head"):
        EngineSpec(auto_members=("ngram", "medusa"))
    with pytest.raises(ValueError, match="members ngram, ngram"):
        EngineSpec(auto_members=("ngram", "ngram"))
    a = cli.build_parser().parse_args(["generate", "--auto-members", "ngram, model,head"])
    assert a.auto_members == ("ngram", "model", "head")


def test_drafter_auto_over_ngram_the_draft_model_and_the_head_keeps_plain_output(capsys):
    """On the CLI's defaults (the packaged Qwen2.5-Coder pair and head on llama.cpp)."""
    assert cli.main(["generate", "--drafter", "auto", "--auto-members", "ngram,model,head", "--max-tokens", "24",
                     "--compare-plain"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("speedup")]
    assert lines and all("outputs identical: True" in line for line in lines)


def test_serve_keeps_a_prompt_cache_by_default_where_the_backend_can_and_as_asked():
    from types import SimpleNamespace

    from draftwise.build import DEFAULT_PROMPT_CACHE_MB

    a = cli.build_parser().parse_args(["serve"])
    assert a.prompt_cache_mb is None  # resolved once the target is loaded
    keeps, cannot = SimpleNamespace(saves=True), SimpleNamespace(saves=False)  # llama.cpp / torch; onnx
    serve = EngineSpec(prompt_cache_mb=None)
    assert serve.prompt_cache_bytes(keeps) == DEFAULT_PROMPT_CACHE_MB << 20
    assert serve.prompt_cache_bytes(cannot) == 0
    assert EngineSpec(prompt_cache_mb=64).prompt_cache_bytes(cannot) == 64 << 20  # asked: refused later
    assert EngineSpec().prompt_cache_bytes(keeps) == 0  # other commands: off unless asked
