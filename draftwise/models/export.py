"""A GGUF model (a packaged name or a .gguf file) as a Hugging Face model directory, for engines
that load one (vLLM, SGLang): `draftwise models export-hf NAME DIR [--dtype bfloat16]`.

transformers dequantises GGUF weights on load but keeps the GGUF quantisation settings in the
model's config, and will not save such a model; the export builds a fresh model from the config
without them, in the dtype asked for, loads the dequantised weights into it and saves that
(safetensors), with the tokenizer converted from the GGUF vocabulary."""
from __future__ import annotations

from pathlib import Path

from draftwise.models.load import _hf_args
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
    loaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw)  # dequantised
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(path, **kw).save_pretrained(out)
    return out
