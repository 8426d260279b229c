"""profile_runner: a fake runner whose forward sleeps in proportion to its tokens, and a real one."""
from __future__ import annotations

import json
import time

import pytest
import torch

from draftwise.backends.base import padded_parts
from draftwise.profile import ProfileResult, profile_runner


class SleepRunner:
    """forward() sleeps 2 ms per new token (over all sequences); records the state it was called in."""

    backend = "fake"
    vocab_size = 50
    max_context = 64
    trees = saves = returns_features = features_free = False
    forward_parts = staticmethod(padded_parts)

    def __init__(self, n_seq_max: int = 4):
        self.n_seq_max = n_seq_max
        self.lengths: dict[int, int] = {}
        self.timed_calls: list[tuple[list[int], list[int]]] = []  # (lengths before, num_logits)

    def identity(self):  # no model file: not cached
        return None

    def new_sequence(self) -> int:
        if len(self.lengths) >= self.n_seq_max:
            raise ValueError("too many sequences")
        seq = max(self.lengths, default=-1) + 1
        self.lengths[seq] = 0
        return seq

    def forward(self, seq_ids, tokens, num_logits):
        before = [self.lengths[s] for s in seq_ids]
        if any(n for n in before):
            self.timed_calls.append((before, list(num_logits)))
        time.sleep(0.002 * sum(len(t) for t in tokens))
        for s, t in zip(seq_ids, tokens):
            assert all(0 <= x < self.vocab_size for x in t)
            self.lengths[s] += len(t)
        return [torch.zeros(k, self.vocab_size) for k in num_logits]

    def truncate(self, seq_id, n):
        assert 0 <= n <= self.lengths[seq_id]
        self.lengths[seq_id] = n

    def length(self, seq_id):
        return self.lengths[seq_id]

    def free(self, seq_id):
        self.lengths.pop(seq_id, None)


def test_fake_runner_times_grow_with_k_and_batch():
    runner = SleepRunner()
    res = profile_runner(runner, ks=(1, 4, 8), batch_sizes=(1, 2), context_len=10, repeats=3, warmup=1)
    assert [(r["batch"], r["k"]) for r in res.rows] == [(1, 1), (1, 4), (1, 8), (2, 1), (2, 4), (2, 8)]
    for r in res.rows:
        assert len(r["ms_all"]) == 3 and r["ms_median"] > 0
        assert r["ms_median"] >= 2.0 * r["batch"] * r["k"] * 0.9  # at least the sleep
    for b in (1, 2):
        assert res.ms(b, 1) < res.ms(b, 4) < res.ms(b, 8)
    assert res.ms(1, 8) < res.ms(2, 8)
    # every timed forward started from context_len tokens and asked logits at all k positions
    assert len(runner.timed_calls) == 6 * (1 + 3)
    for before, num_logits in runner.timed_calls:
        assert set(before) == {10}
        assert len(set(num_logits)) == 1 and num_logits[0] in (1, 4, 8)
    assert runner.lengths == {}  # all sequences freed

    table = res.format_table()
    assert "x k=1" in table and len(table.splitlines()) == 2 + 6
    back = ProfileResult(**json.loads(res.to_json()))
    assert back == res


def test_given_context_tokens_and_save(tmp_path):
    prefills = []  # what each sequence is fed first: its context

    class Rec(SleepRunner):
        def forward(self, seq_ids, tokens, num_logits):
            prefills.extend(list(t) for s, t in zip(seq_ids, tokens) if self.lengths[s] == 0)
            return super().forward(seq_ids, tokens, num_logits)
    runner = Rec()
    res = profile_runner(runner, ks=[2], batch_sizes=[3], context_len=5, repeats=1, warmup=0,
                         tokens=[1, 2, 3, 4, 5, 6, 7])
    assert res.rows[0]["batch"] == 3 and res.context_len == 5
    assert prefills and all(p == [1, 2, 3, 4, 5] for p in prefills)  # the given tokens' first 5
    path = res.save(tmp_path / "out" / "profile.json")
    assert ProfileResult.load(path) == res


def test_bad_arguments():
    runner = SleepRunner()
    with pytest.raises(ValueError, match="exceeds the runner's context of 64"):
        profile_runner(runner, ks=(1, 8), context_len=60)
    with pytest.raises(ValueError, match=">= 1"):
        profile_runner(runner, ks=(0, 1), context_len=8)
    with pytest.raises(ValueError, match="3 tokens given"):
        profile_runner(runner, ks=(1,), context_len=8, tokens=[1, 2, 3])
    with pytest.raises(ValueError, match="too many sequences"):
        profile_runner(runner, ks=(1,), batch_sizes=(5,), context_len=8)
    assert runner.lengths == {}  # freed even when a batch fails part way


def test_llama_runner_profile():
    pytest.importorskip("llama_cpp")
    from draftwise.models.load import load_llama

    runner, _ = load_llama("smollm2-135m", threads=1, n_ctx=128, n_seq_max=2)
    try:
        res = profile_runner(runner, ks=(1, 2, 4), batch_sizes=(1, 2), context_len=32, repeats=1)
        assert res.backend == "llama.cpp" and res.meta["n_threads"] == 1
        assert [(r["batch"], r["k"]) for r in res.rows] == [(b, k) for b in (1, 2) for k in (1, 2, 4)]
        assert all(r["ms_median"] > 0 and len(r["ms_all"]) == 1 for r in res.rows)
        assert runner.kv_bytes() == 0  # the profile freed its sequences
        assert "batch" in res.format_table()
    finally:
        runner.close()


def test_torch_runner_profile():
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftwise.backends.torch_runner import TorchRunner

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    runner = TorchRunner(LlamaForCausalLM(cfg))
    res = profile_runner(runner, ks=(1, 3), batch_sizes=(1, 2), context_len=16, repeats=2)
    assert res.backend == "torch" and len(res.rows) == 4
    assert all(r["ms_median"] > 0 for r in res.rows)
    assert runner.kv_bytes() == 0


def test_profile_cache_tells_models_in_one_directory_apart():
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from draftwise.backends.torch_runner import TorchRunner
    from draftwise.profile import runner_identity

    def runner(hidden):
        torch.manual_seed(0)
        m = Qwen2ForCausalLM(Qwen2Config(hidden_size=hidden, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, vocab_size=64))
        m.config._name_or_path = "/models"  # two GGUF files in one directory share this name
        return TorchRunner(m)
    a, b = runner_identity(runner(32)), runner_identity(runner(64))
    assert a is not None and b is not None and a != b


def test_cached_profile_is_measured_again_when_the_method_changes(tmp_path, monkeypatch):
    import draftwise.profile as prof

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    monkeypatch.setattr(prof, "runner_identity", lambda r: {"backend": "fake", "model": "sleep"})
    monkeypatch.setattr(prof.os, "getloadavg", lambda: (0.5, 0.0, 0.0))  # a quiet machine: cached
    runner = SleepRunner()
    first = prof.cached_profile(runner, ks=(1, 2), context_len=8, repeats=1)
    calls = len(runner.timed_calls)
    again = prof.cached_profile(runner, ks=(1, 2), context_len=8, repeats=1)
    assert len(runner.timed_calls) == calls and again.rows == first.rows  # read from the cache
    monkeypatch.setattr(prof, "METHOD", prof.METHOD + 1)
    prof.cached_profile(runner, ks=(1, 2), context_len=8, repeats=1)
    assert len(runner.timed_calls) > calls  # measured again, in a file of its own
    files = list((tmp_path / "profiles").glob("fake-*.json"))
    assert len(files) == 2
    assert {json.loads(f.read_text())["meta"]["identity"]["method"] for f in files} == {prof.METHOD - 1, prof.METHOD}


def test_a_curve_measured_on_a_busy_machine_is_used_but_not_cached(tmp_path, monkeypatch):
    import draftwise.profile as prof

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    monkeypatch.setattr(prof, "runner_identity", lambda r: {"backend": "fake", "model": "sleep"})
    monkeypatch.setattr(prof.os, "getloadavg", lambda: (4.0 * (prof.os.cpu_count() or 1), 0.0, 0.0))
    said = []
    busy = prof.cached_profile(SleepRunner(), ks=(1, 2), context_len=8, repeats=1, log=said.append)
    assert busy.rows and not list((tmp_path / "profiles").glob("*.json"))
    assert any("not caching" in m for m in said)
    monkeypatch.setattr(prof.os, "getloadavg", lambda: (0.5, 0.0, 0.0))
    prof.cached_profile(SleepRunner(), ks=(1, 2), context_len=8, repeats=1)
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 1


def test_profile_cli_opens_as_many_llama_sequences_as_its_largest_batch(tmp_path, capsys):
    pytest.importorskip("llama_cpp")
    from draftwise.cli import main

    out = tmp_path / "curve.json"
    assert main(["profile", "--model", "smollm2-135m", "--backend", "llama.cpp", "--max-k", "1",
                 "--batch-sizes", "1", "6", "--repeats", "1", "--context-len", "8", "--out", str(out)]) == 0
    assert out.is_file() and "6    1" in capsys.readouterr().out  # 6 > the loader's default of 4 sequences
