"""The head drafter (EAGLE style) on a real small target, SmolLM2-135M: checkpoints in draftwise's
and EAGLE-3's layout, refusal of a head made for another target, greedy identity with plain
decoding on both backends, the drafts in generation equal to what training's teacher-forced
unroll predicts at the same positions (so training and drafting read the same features), the
sampling check at temperature > 0, and `draftwise train-head` end to end with resume."""
import json

import pytest
import torch
from safetensors.torch import save_file

from draftwise import cli, train_head
from draftwise.backends.head_runner import HeadRunner
from draftwise.drafters.head import HeadDrafter
from draftwise.engine import Engine
from draftwise.losscheck import check_sampling
from draftwise.models.head import HeadConfig, HeadMismatch, load_head, new_head, save_head
from draftwise.models.load import load_runner
from draftwise.policy import FixedDraftLength
from draftwise.train_head import features_of, ttt_losses

PROMPT = "Write a Python function that returns the largest of three numbers."


@pytest.fixture(scope="module")
def smol_torch():
    return load_runner("smollm2-135m", "torch", threads=2)


@pytest.fixture(scope="module")
def smol_llama():
    pytest.importorskip("llama_cpp")
    return load_runner("smollm2-135m", "llama.cpp", threads=2)


def _head_dir(runner, path, dv=1024, seed=0):
    """A randomly initialised draftwise head for the runner's target, saved to `path`."""
    emb, rows = runner.embedding_tables()
    ids = torch.arange(0, 2 * dv, 2)  # every other token: a draft vocabulary that is not a prefix
    c = HeadConfig(runner.hidden_size, 4, 2, 64, 256, runner.vocab_size, dv, [], 1e-6, 10000.0)
    save_head(new_head(c, emb, rows(ids), ids - torch.arange(dv), seed), path, dtype=torch.float32)
    return path


def _drafter(runner, path):
    return HeadDrafter(HeadRunner(load_head(path, runner), str(path), runner.max_context))


class _Recorder(HeadDrafter):
    """Keeps every proposal with the context length it was made at."""
    def __init__(self, runner):
        super().__init__(runner)
        self.log = []

    def propose_many(self, items):
        props = super().propose_many(items)
        self.log += [(len(it[1]), p.tokens) for it, p in zip(items, props)]
        return props


def test_checkpoint_round_trip_keeps_weights_and_leaves_the_target_tables_out(smol_torch, tmp_path):
    runner, _ = smol_torch
    path = _head_dir(runner, tmp_path / "h")
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 1024
    head = load_head(path, runner)
    assert head.draft_to_target.tolist() == list(range(0, 2048, 2))
    # the embedding and LM head rows come from the target: the file holds the layer alone
    assert (path / "model.safetensors").stat().st_size < 4 * (sum(v.numel() for v in head.weights().values()) + 4096)
    assert torch.equal(head.lm_head_rows, runner.embedding_tables()[1](torch.arange(0, 2048, 2)))


def test_a_head_for_another_target_is_refused_naming_both(smol_torch, smol_llama, tmp_path):
    runner, _ = smol_torch
    emb = torch.zeros(runner.vocab_size, 64)
    c = HeadConfig(64, 2, 2, 32, 64, runner.vocab_size, 16)
    save_head(new_head(c, emb, torch.zeros(16, 64), torch.zeros(16, dtype=torch.long)), tmp_path / "small")
    with pytest.raises(HeadMismatch, match="hidden size 64, the target 576"):
        load_head(tmp_path / "small", runner)
    c = HeadConfig(576, 4, 2, 64, 64, 1000, 16)
    save_head(new_head(c, torch.zeros(1000, 576), torch.zeros(16, 576), torch.zeros(16, dtype=torch.long)), tmp_path / "voc")
    with pytest.raises(HeadMismatch, match="vocabulary of 1000 tokens, the target 49152"):
        load_head(tmp_path / "voc", runner)
    c = HeadConfig(576, 4, 2, 64, 64, runner.vocab_size, 16, [2, 15, 27])
    save_head(new_head(c, emb[:, :1].expand(-1, 576), torch.zeros(16, 576), torch.zeros(16, dtype=torch.long)), tmp_path / "e3")
    with pytest.raises(HeadMismatch, match="llama.cpp backend returns only the last layer"):
        load_head(tmp_path / "e3", smol_llama[0])


def test_eagle3_checkpoint_in_vllm_layout_drafts_and_keeps_greedy_output(smol_torch, tmp_path):
    """A checkpoint as vLLM / SGLang serve it: its own LM head over a draft vocabulary, d2t / t2d,
    fc over three target layers (vLLM's default ids when the config names none)."""
    runner, tok = smol_torch
    H, V, dv = 576, runner.vocab_size, 512
    g = torch.Generator().manual_seed(0)

    def r(*shape):
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    ids = torch.arange(dv) * 3
    w = {"fc.weight": r(H, 3 * H), "norm.weight": torch.ones(H), "lm_head.weight": r(dv, H),
         "d2t": ids - torch.arange(dv), "t2d": torch.zeros(V, dtype=torch.bool).index_fill(0, ids, True),
         "midlayer.input_layernorm.weight": torch.ones(H), "midlayer.hidden_norm.weight": torch.ones(H),
         "midlayer.post_attention_layernorm.weight": torch.ones(H),
         "midlayer.self_attn.q_proj.weight": r(4 * 64, 2 * H), "midlayer.self_attn.k_proj.weight": r(2 * 64, 2 * H),
         "midlayer.self_attn.v_proj.weight": r(2 * 64, 2 * H), "midlayer.self_attn.o_proj.weight": r(H, 4 * 64),
         "midlayer.mlp.gate_proj.weight": r(128, H), "midlayer.mlp.up_proj.weight": r(128, H),
         "midlayer.mlp.down_proj.weight": r(H, 128)}
    d = tmp_path / "eagle3"
    d.mkdir()
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in w.items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 128, "vocab_size": V,
        "draft_vocab_size": dv, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}))
    head = load_head(d, runner)
    assert head.config.feature_layers == [2, 15, 27] and head.config.feature_size == 3 * H
    assert not hasattr(head, "lm_head_rows") and torch.equal(head.draft_to_target, ids)
    plain = Engine(runner, tok).generate(PROMPT, max_tokens=24)
    drafter = HeadDrafter(HeadRunner(head, str(d), runner.max_context))
    spec = Engine(runner, tok, drafter, 3).generate(PROMPT, max_tokens=24)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.proposed_tokens > 0 and all(t % 3 == 0 for t in drafter.runner._ids.tolist())


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_greedy_output_equals_plain_decoding(backend, smol_torch, smol_llama, tmp_path):
    runner, tok = smol_torch if backend == "torch" else smol_llama
    path = _head_dir(runner, tmp_path / "h")
    plain = Engine(runner, tok).generate(PROMPT, max_tokens=32)
    for d in (1, 4):
        spec = Engine(runner, tok, _drafter(runner, path), d).generate(PROMPT, max_tokens=32)
        assert spec.token_ids == plain.token_ids
        assert spec.stats.proposed_tokens >= 20


@pytest.mark.parametrize("backend", ["torch", "llama.cpp"])
def test_a_head_drafts_after_a_cached_prompt(backend, smol_torch, smol_llama, tmp_path):
    """A cached prompt brings no target features for the part it skips: the head starts from the
    features it gets (the rest of the prompt's, or the first step's) and output stays plain's."""
    runner, tok = smol_torch if backend == "torch" else smol_llama
    eng = Engine(runner, tok, _drafter(runner, _head_dir(runner, tmp_path / "h")), 3, prompt_cache_bytes=64 << 20)
    for prompt in (PROMPT, PROMPT, PROMPT + "\n\ndef largest("):
        plain = Engine(runner, tok).generate(prompt, max_tokens=24)
        spec = eng.generate(prompt, max_tokens=24)
        assert spec.token_ids == plain.token_ids and spec.stats.proposed_tokens > 0
    assert spec.stats.cached_tokens == len(tok.encode(PROMPT))


class _Later(FixedDraftLength):
    """D = 2 from the request's 6th step on, plain steps before (as a planner that starts drafting)."""
    def _d(self, st, n):
        steps = st.stats.plain_steps + st.stats.verification_rounds
        return super()._d(st, n) if steps >= 6 else 0


def test_llama_computes_features_only_for_the_rounds_the_head_reads_them(smol_llama, tmp_path):
    """On llama.cpp features cost work: prefill and plain steps return none; the step where the
    head first would draft lacks the context's features and runs plain to collect them, it drafts
    from the next, and the output is plain decoding's."""
    runner, tok = smol_llama
    drafter = _drafter(runner, _head_dir(runner, tmp_path / "h"))
    calls = []  # (tokens fed, features on) per target forward
    forward, forward_features = runner.forward, runner.forward_features

    def spy(seqs, tokens, ks, *a):
        calls.append((sum(map(len, tokens)), False))
        return forward(seqs, tokens, ks, *a)

    def spy_features(seqs, tokens, ks, *a):
        calls.append((sum(map(len, tokens)), True))
        return forward_features(seqs, tokens, ks, *a)

    prompt = tok.encode(PROMPT)
    plain = Engine(runner, tok).generate(prompt, max_tokens=24)
    runner.forward, runner.forward_features = spy, spy_features
    try:
        res = Engine(runner, tok, drafter, policy=_Later(2)).generate(prompt, max_tokens=24)
    finally:
        del runner.forward, runner.forward_features
    assert res.token_ids == plain.token_ids
    assert calls[0] == (len(prompt), False)  # prefill
    # steps 1..5 plain without features; step 6 plain, collecting them; drafts (2 + 1 fed) from step 7 on
    assert [c[1] for c in calls[1:6]] == [False] * 5 and [c[0] for c in calls[1:7]] == [1] * 6
    assert calls[6][1] and calls[7] == (3, True)
    assert res.stats.verification_rounds >= 3 and res.stats.plain_steps >= 7


def test_a_head_runs_in_bf16_only_where_that_is_clearly_faster(smol_torch, tmp_path, monkeypatch):
    from draftwise.backends import head_runner

    runner, tok = smol_torch
    head = load_head(_head_dir(runner, tmp_path / "h"), runner)
    for bf16_s, want in ((0.85, torch.float32), (0.75, torch.bfloat16)):  # fp32 takes 1.0
        monkeypatch.setattr(head_runner, "_CHOSEN", {})
        monkeypatch.setattr(head_runner, "_token_s", lambda mats, r, rows=1, b=bf16_s: b if mats[0].dtype == torch.bfloat16 else 1.0)
        assert head_runner.fastest_dtype(head) == want
    # level for a drafted token's one row, 4x faster for a training batch's rows: the choice follows the rows
    monkeypatch.setattr(head_runner, "_CHOSEN", {})
    monkeypatch.setattr(head_runner, "_token_s",
                        lambda mats, r, rows=1: (1.0 if rows == 1 else 0.25) if mats[0].dtype == torch.bfloat16 else 1.0)
    assert head_runner.fastest_dtype(head) == torch.float32
    assert head_runner.fastest_dtype(head, rows=512) == torch.bfloat16 and train_head._bf16(head)
    monkeypatch.setenv("DRAFTWISE_HEAD_DTYPE", "float32")
    assert head_runner.fastest_dtype(head) == torch.float32 and not train_head._bf16(head)
    monkeypatch.setenv("DRAFTWISE_HEAD_DTYPE", "fp16")
    with pytest.raises(ValueError, match="DRAFTWISE_HEAD_DTYPE"):
        head_runner.fastest_dtype(head)
    # in bf16 it drafts (its own q, in bf16) and greedy output stays plain decoding's
    hr = HeadRunner(head.to(torch.bfloat16), str(tmp_path / "h"), runner.max_context)
    assert hr.dtype == "bfloat16"
    plain = Engine(runner, tok).generate(PROMPT, max_tokens=16)
    spec = Engine(runner, tok, HeadDrafter(hr), 3).generate(PROMPT, max_tokens=16)
    assert spec.token_ids == plain.token_ids and spec.stats.proposed_tokens >= 9


def test_drafts_are_what_the_teacher_forced_unroll_predicts(smol_torch, tmp_path):
    """Every drafted token equals the training unroll's argmax at the same position and step, over
    the text the generation produced: drafting and training read the same features, positions and
    attention (for steps 2 and 3, where the earlier drafts were the committed tokens)."""
    runner, tok = smol_torch
    path = _head_dir(runner, tmp_path / "h", seed=3)
    rec = _Recorder(HeadRunner(load_head(path, runner), str(path), runner.max_context))
    prompt = tok.encode(PROMPT)
    res = Engine(runner, tok, rec, 3).generate(prompt, max_tokens=40)
    text = prompt + res.token_ids
    logits, feats = features_of(runner, text)
    greedy = logits.argmax(-1)
    head = rec.runner.head
    t2d = torch.full((runner.vocab_size,), -1, dtype=torch.long)
    t2d[head.draft_to_target] = torch.arange(head.config.draft_vocab_size)
    with torch.no_grad():
        _, _, _, preds = ttt_losses(head, torch.tensor([text]), feats[None], greedy[None], 3, t2d)
    checked = 0
    for L, draft in rec.log:
        i = L - 2  # the chain that starts at the last committed position
        for s, d in enumerate(draft, 1):
            if s > 1 and draft[s - 2] != text[L + s - 2]:
                break  # the earlier draft was rejected: the unroll fed another token
            if i >= preds[s - 1].shape[1]:
                break
            assert d == int(head.draft_to_target[preds[s - 1][0, i]]), (L, s)
            checked += 1
    assert checked >= 30


def test_sampling_at_temperature_keeps_the_target_distribution(smol_llama, tmp_path):
    runner, tok = smol_llama
    path = _head_dir(runner, tmp_path / "h")
    plain = Engine(runner, tok, reuse_prefix=True)
    spec = Engine(runner, tok, _drafter(runner, path), 3, reuse_prefix=True)
    ids = tok.encode("The three primary colours are")
    rep = check_sampling(plain, spec, [ids], 0.7, 0.9, positions=2, min_tv=0.15)
    assert rep.verdict == "PASS", rep.summary()
    by_pos = {r.position: r for r in rep.results}
    # on llama.cpp the prefill returns no features, so the first token is a plain step's and the
    # head's drafts (and their rejections) start at position 2: that is the position tested
    assert by_pos[1].rejections == 0 and by_pos[2].tested, rep.summary()


def test_train_head_cli_end_to_end_and_resume(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["train-head", "--target", "smollm2-135m", "--out", str(out), "--max-tokens", "3000", "--answers", "1",
            "--answer-tokens", "16", "--seq-len", "128", "--draft-vocab", "512", "--intermediate", "128",
            "--epochs", "1", "--ttt-steps", "2"]
    assert cli.main(args) == 0
    assert "held-out teacher-forced acceptance per position" in capsys.readouterr().out
    man = json.loads((out / "features" / "manifest.json").read_text())
    assert man["done"] and sum(s["tokens"] for s in man["shards"]) >= 3000 and man["sources"]["answer"] > 0
    log = json.loads((out / "train" / "log.json").read_text())
    assert len(log["epochs"]) == 1 and len(log["epochs"][0]["acceptance_per_position"]) == 2
    steps = log["epochs"][0]["step"]
    assert cli.main(args[:-4] + ["--epochs", "2", "--ttt-steps", "2"]) == 0  # resumes at the checkpoint
    log = json.loads((out / "train" / "log.json").read_text())
    assert [e["step"] for e in log["epochs"]] == [steps, 2 * steps]
    runner, _ = load_runner("smollm2-135m", "torch", threads=2)
    assert load_head(out / "head", runner).config.draft_vocab_size == 512
    # --subsample 2 on the same features: every 2nd training sequence, the same held-out slice
    half = tmp_path / "half"
    half.mkdir()
    (half / "features").symlink_to(out / "features")
    n = len(train_head._load_shards(out / "features", man))
    n_train = sum(i % 20 != 19 for i in range(n))
    assert cli.main(["train-head", "--target", "smollm2-135m", "--out", str(half), "--draft-vocab", "512",
                     "--intermediate", "128", "--epochs", "1", "--ttt-steps", "2", "--subsample", "2"]) == 0
    sub = json.loads((half / "train" / "log.json").read_text())
    assert steps == -(-n_train // 4) and sub["epochs"][0]["step"] == -(-((n_train + 1) // 2) // 4)
    with pytest.raises(SystemExit):
        cli.main(["train-head", "--out", str(half), "--subsample", "0"])
    assert "--subsample: expected an integer >= 1, got '0'" in capsys.readouterr().err


def test_a_head_exported_for_vllm_feeds_its_fc_the_same_normed_state(tmp_path, capsys):
    """`models export-eagle3`: vLLM's EAGLE-3 hands the head the last layer's output before the
    final norm; with norm_before_fc and the target's final norm as input_norm it computes
    fc(input_norm(h)), what draftwise's head computes from the target's normed state."""
    from draftwise.models.head import RMSNorm

    H, V, dv, L = 8, 40, 6, 5
    g = torch.Generator().manual_seed(0)
    table, norm_w = torch.randn(V, H, generator=g), torch.rand(H, generator=g) + 0.5
    ids = torch.tensor([1, 4, 9, 16, 25, 36])  # the draft vocabulary's target ids
    c = HeadConfig(H, 2, 1, 4, 16, V, dv, [], 1e-6, 10000.0)
    head = new_head(c, table, table[ids], ids - torch.arange(dv))
    save_head(head, tmp_path / "h", dtype=torch.float32)
    hf = tmp_path / "target"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"num_hidden_layers": L, "hidden_size": H, "vocab_size": V}))
    save_file({"model.norm.weight": norm_w, "model.embed_tokens.weight": table}, str(hf / "model.safetensors"))
    assert cli.main(["models", "export-eagle3", str(tmp_path / "h"), str(hf), str(tmp_path / "v")]) == 0
    cfg = json.loads((tmp_path / "v" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and "draftwise" not in cfg
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [L], "use_aux_hidden_state": True,
                                   "norm_before_fc": True}
    from safetensors.torch import load_file
    w = {k: v.float() if v.is_floating_point() else v for k, v in load_file(str(tmp_path / "v" / "model.safetensors")).items()}
    assert torch.equal(w["d2t"], ids - torch.arange(dv))
    assert torch.allclose(w["lm_head.weight"], table[ids].bfloat16().float())  # tied: the embedding's rows
    for k, v in head.weights().items():
        assert torch.allclose(w[k].float(), v.float().bfloat16().float()), k
    h = torch.randn(3, H, generator=g)  # the target's last layer output, before its final norm
    target_norm, input_norm = RMSNorm(H, 1e-6), RMSNorm(H, cfg["rms_norm_eps"])
    target_norm.weight.data, input_norm.weight.data = norm_w, w["input_norm.weight"]
    vllm_in = input_norm(h) @ w["fc.weight"].T
    ours = head.fc(target_norm(h).bfloat16().float())
    assert torch.allclose(vllm_in, ours, atol=0.05, rtol=0.02)
    (hf / "config.json").write_text(json.dumps({"num_hidden_layers": L, "hidden_size": 16, "vocab_size": V}))
    assert cli.main(["models", "export-eagle3", str(tmp_path / "h"), str(hf), str(tmp_path / "w")]) == 2
    assert "hidden size 8 and 40 tokens; the target" in capsys.readouterr().err
