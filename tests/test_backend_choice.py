"""`--backend auto`: the target's backend (and llama.cpp's kernels) chosen by each candidate's
measured forwards of 1..8 tokens; onnx only where it can serve the drafting. No model is loaded:
runners and their cached curves are stand-ins."""
from types import SimpleNamespace

import pytest

import draftwise.build as build
import draftwise.profile as profile
from draftwise.build import EngineSpec, load_target

LLAMA_STD = [30, 50, 70, 90, 110, 130, 150, 170]  # ms per forward of k = 1..8 tokens
LLAMA_REP = [26, 48, 66, 80, 100, 120, 140, 160]
ONNX = [35, 37, 40, 46, 52, 58, 64, 71]


class Stand:
    max_context = 512

    def __init__(self, backend: str, fast: bool | None):
        self.backend, self.fast, self.closed = backend, fast, False

    def identity(self):
        return {"model": "m", "fast": self.fast}

    def close(self):
        self.closed = True


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """Fake loading and measuring (each pass: the curve, plus 1 ms in the first pass of each);
    returns (curves by (backend, fast kernels), runners loaded, passes measured)."""
    curves = {("llama.cpp", False): LLAMA_STD, ("llama.cpp", True): LLAMA_REP, ("onnx", None): ONNX}
    loaded, passes = [], []

    def load(target, backend, threads, ctx, **kw):
        loaded.append(Stand(backend, kw.get("fast_kernels")))
        return loaded[-1], "tokenizer"

    def measure(runner, ks, batch_sizes, context_len, repeats, warmup, seed):
        passes.append((runner.backend, runner.fast, seed))
        ms = curves[(runner.backend, runner.fast)]
        return SimpleNamespace(rows=[{"batch": 1, "k": k, "ms_median": ms[k - 1] + (seed == 1)} for k in ks])

    monkeypatch.setattr(build, "load_runner", load)
    weights = tmp_path / "target.gguf"
    weights.write_bytes(b"gguf")
    monkeypatch.setattr(build, "resolve", lambda spec: SimpleNamespace(path=str(weights)))  # the choice's key
    monkeypatch.setattr(profile, "profile_runner", measure)
    monkeypatch.setattr(profile, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(profile.os, "getloadavg", lambda: (0.5, 0.0, 0.0))  # a quiet machine: the choice is kept
    onnx_installed(monkeypatch)
    return curves, loaded, passes


def onnx_installed(monkeypatch):
    """As if the onnx extra were installed (may_run_on_onnx looks for the runtime's package)."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "onnxruntime_genai" else real(name, *a))


def test_auto_takes_the_backend_whose_forwards_of_one_to_eight_tokens_cost_least(measured, tmp_path):
    curves, loaded, passes = measured
    spec = EngineSpec(backend="auto", drafter="ngram", max_running=1)
    runner, _ = load_target(spec, log=lambda m: None)
    assert (spec.backend, spec.kernels, runner.backend) == ("onnx", "repacked", "onnx")
    assert [r.closed for r in loaded] == [True, True, False]  # both llama.cpp runners given back
    # side by side: each pass takes every runner in turn; pass 0 warms up, three are kept
    assert [p[2] for p in passes] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    (saved,) = (tmp_path / "choices").iterdir()
    assert '"chosen": "onnx"' in saved.read_text() and str(sum(ONNX)) in saved.read_text()  # medians, not pass 1's
    curves[("onnx", None)] = [m + 60 for m in ONNX]  # the cached choice stands: not measured again,
    spec = EngineSpec(backend="auto", drafter="ngram", max_running=1)  # and its winner alone is loaded
    assert load_target(spec, log=lambda m: None)[0].backend == "onnx" and len(passes) == 12 and len(loaded) == 4
    saved.unlink()  # measured again: now 898 ms against repacked llama.cpp's 740
    spec = EngineSpec(backend="auto", drafter="ngram", max_running=1)
    runner, _ = load_target(spec, log=lambda m: None)
    assert (spec.backend, spec.kernels, runner.fast) == ("llama.cpp", "repacked", True) and not runner.closed
    kernels_only = EngineSpec(backend="llama.cpp", drafter="ngram")  # other candidates: another choice
    assert load_target(kernels_only, log=lambda m: None)[0].fast and len(passes) == 12 + 12 + 8


def test_a_choice_is_measured_again_for_another_model_file(measured, tmp_path):
    import os

    _, loaded, passes = measured
    load_target(EngineSpec(backend="auto", drafter="ngram", max_running=1), log=lambda m: None)
    assert len(passes) == 12 and len(loaded) == 3
    os.utime(tmp_path / "target.gguf", (1, 1))  # the weights file replaced (its mtime moved)
    load_target(EngineSpec(backend="auto", drafter="ngram", max_running=1), log=lambda m: None)
    assert len(passes) == 24 and len(loaded) == 6 and len(list((tmp_path / "choices").iterdir())) == 2


def test_auto_without_a_drafter_is_the_default_backend_and_a_fixed_backend_is_not_compared(measured):
    _, loaded, _ = measured
    assert EngineSpec(backend="auto", drafter="none").backend == "llama.cpp"
    spec = EngineSpec(backend="llama.cpp", drafter="ngram")  # kernels auto: llama.cpp's two only
    load_target(spec, log=lambda m: None)
    assert spec.backend == "llama.cpp" and [r.backend for r in loaded] == ["llama.cpp", "llama.cpp"]


@pytest.mark.parametrize("kw, onnx", [({"drafter": "ngram"}, True), ({"drafter": "suffix"}, True),
                                       ({"drafter": "model"}, True), ({"drafter": "auto"}, True),
                                       ({"drafter": "auto", "auto_members": ("suffix", "head")}, False),
                                       ({"drafter": "head"}, False), ({"drafter": "suffix-tree"}, False),
                                       ({"drafter": "ngram", "trees": True}, False),
                                       ({"drafter": "ngram", "max_running": 4}, False)])
def test_onnx_is_a_candidate_only_for_drafting_it_can_serve(monkeypatch, kw, onnx):
    onnx_installed(monkeypatch)
    spec = EngineSpec(backend="auto", **{"max_running": 1, **kw})
    assert spec.may_run_on_onnx() is onnx and spec.backend == ("auto" if onnx else "llama.cpp")
    assert spec.draft_backend == "llama.cpp"  # a draft model stays on llama.cpp


def test_auto_without_the_onnx_runtime_installed_is_llama_cpp(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime_genai" else real(name, *a))
    assert EngineSpec(backend="auto", drafter="ngram", max_running=1).backend == "llama.cpp"


def test_a_failed_onnx_conversion_leaves_onnx_out_and_the_run_goes_on(measured, monkeypatch):
    _, loaded, _ = measured
    real = build.load_runner

    def load(target, backend, *a, **kw):
        if backend == "onnx":
            raise RuntimeError("the onnxruntime-genai builder failed (exit 1): ...")
        return real(target, backend, *a, **kw)

    monkeypatch.setattr(build, "load_runner", load)
    said = []
    spec = EngineSpec(backend="auto", drafter="ngram", max_running=1)
    runner, _ = load_target(spec, log=said.append)
    assert (spec.backend, spec.kernels) == ("llama.cpp", "repacked") and runner.fast
    assert any("onnx left out" in m and "builder failed" in m for m in said)
