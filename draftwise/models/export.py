"""A GGUF model (a packaged name or a .gguf file) as a Hugging Face model directory, for engines
that load one (vLLM, SGLang): `draftwise models export-hf NAME DIR [--dtype bfloat16]`; and a
draft head as the EAGLE-3 checkpoint vLLM serves: `draftwise models export-eagle3 HEAD TARGET_HF DIR`.

transformers dequantises GGUF weights on load but keeps the GGUF quantisation settings in the
model's config, and will not save such a model; the export builds a fresh model from the config
without them, in the dtype asked for, loads the dequantised weights into it and saves that
(safetensors), with the tokenizer converted from the GGUF vocabulary."""
from __future__ import annotations

from pathlib import Path

from draftwise.models.load import _hf_args, gguf_parsed_once
from draftwise.models.registry import resolve

DTYPES = ("bfloat16", "float16", "float32")


def export_hf(spec: str, out_dir: str | Path, dtype: str = "bfloat16") -> Path:
    """Write the model `spec` names to `out_dir` (new or empty) as a Hugging Face directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    src = resolve(spec)
    if src.kind != "gguf":
        raise ValueError(f"{spec!r} is already a {src.kind} model ({src.path}); export-hf converts GGUF models")
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory")
    path, kw = _hf_args(src)
    with gguf_parsed_once():  # the config, the weights and the vocabulary from one parse
        loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw)  # dequantised
        tokenizer = AutoTokenizer.from_pretrained(path, **kw)
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def export_eagle3(head: str, target: str, target_hf: str | Path, out_dir: str | Path) -> Path:
    """A draftwise head as the EAGLE-3 checkpoint vLLM serves (`--speculative-config '{"method":
    "eagle3", "model": DIR, ...}'`), for the target's Hugging Face export `target_hf`.

    draftwise's heads read the target's last layer *normed* state through `fc`; vLLM's EAGLE-3
    feeds the head concatenated residual-stream states of chosen layers, each the output of a
    layer before any final norm. Asked for the output of the last layer (aux layer id = the
    layer count) with `norm_before_fc` and the target's own final norm as `input_norm`, vLLM
    computes fc(norm(h_L)): the same input. The head's LM head over the draft vocabulary is
    written out from the target's LM head rows (vLLM wants the draft vocabulary's own), and its
    embedding is left to be shared with the target (vLLM does that for a head without one). A
    head that already reads EAGLE-3 feature layers is written with its own layer ids."""
    import json

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from draftwise.models.head import CONFIG, WEIGHTS, read_config
    from draftwise.models.heads import resolve_head

    src, hf, out = resolve_head(head, target), Path(target_hf), Path(out_dir)
    if not (hf / "config.json").is_file():
        raise FileNotFoundError(f"{hf} is not a Hugging Face model directory (models export-hf {target} DIR makes one)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty directory")
    tcfg = json.loads((hf / "config.json").read_text())
    c = read_config(src, tcfg["num_hidden_layers"])
    if (c.hidden_size, c.vocab_size) != (tcfg["hidden_size"], tcfg["vocab_size"]):
        raise ValueError(f"head {src} has hidden size {c.hidden_size} and {c.vocab_size} tokens; the target {hf} "
                         f"{tcfg['hidden_size']} and {tcfg['vocab_size']}")
    w = {k.replace("layers.0.", "midlayer."): v for k, v in load_file(str(src / WEIGHTS)).items()}
    d2t = w["d2t"].long() if "d2t" in w else torch.zeros(c.draft_vocab_size, dtype=torch.long)
    tw = {}
    with safe_open(str(next(hf.glob("*.safetensors"))), "pt") as f:
        names = set(f.keys())
        tw["norm"] = f.get_tensor("model.norm.weight")
        if "lm_head.weight" not in w:
            lm = f.get_tensor("lm_head.weight" if "lm_head.weight" in names else "model.embed_tokens.weight")
            w["lm_head.weight"] = lm[torch.arange(c.draft_vocab_size) + d2t].clone()
    eagle = {"eagle_aux_hidden_state_layer_ids": c.feature_layers}
    if not c.feature_layers:
        eagle = {"eagle_aux_hidden_state_layer_ids": [tcfg["num_hidden_layers"]], "use_aux_hidden_state": True,
                 "norm_before_fc": True}
        w["input_norm.weight"] = tw["norm"]
    w["d2t"] = d2t
    w = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in w.items()}
    cfg = {**c.to_json(), "eagle_config": eagle, "target_hidden_size": c.hidden_size, "torch_dtype": "bfloat16"}
    del cfg["draftwise"]
    out.mkdir(parents=True, exist_ok=True)
    save_file(w, str(out / WEIGHTS))
    (out / CONFIG).write_text(json.dumps(cfg, indent=1) + "\n")
    return out
