"""Load a model spec as a (runner, tokenizer) pair on a backend."""
from __future__ import annotations

import hashlib
import os
from contextlib import contextmanager
from pathlib import Path

from draftwise.machine import cache_dir
from draftwise.models.registry import PACKAGED, ModelSource, resolve
from draftwise.tokenizer import Tokenizer

# end-of-turn tokens that stop generation when present (as llama.cpp's end-of-generation set)
_EOG_STRINGS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")


def _hf_args(src: ModelSource) -> tuple[str, dict]:
    if src.kind == "gguf":
        p = Path(src.path)
        return str(p.parent), {"gguf_file": p.name}
    return src.path, {}


@contextmanager
def gguf_parsed_once():
    """transformers reads a GGUF file's metadata twice per model (its config, then its weights),
    and gguf's reader parses every entry of the vocabulary arrays in Python (~15 s for a
    150k-token vocabulary): within this block, a file is parsed once (the reader is read-only)."""
    try:
        import gguf
    except ImportError:  # no GGUF support installed: nothing to share
        yield
        return
    cls, readers = gguf.GGUFReader, {}

    def reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = cls(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = cls


def load_tokenizer(src: ModelSource) -> Tokenizer:
    from transformers import AutoTokenizer

    path, kw = _hf_args(src)
    if src.kind == "gguf":  # converting a GGUF vocabulary takes ~20 s: keep the result
        st = Path(src.path).stat()
        key = hashlib.sha256(f"{Path(src.path).resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:16]
        saved = cache_dir() / "tokenizers" / f"{Path(src.path).stem}-{key}"
        if (saved / "tokenizer_config.json").is_file():
            hf = AutoTokenizer.from_pretrained(saved)
        else:
            hf = AutoTokenizer.from_pretrained(path, **kw)
            hf.save_pretrained(saved)
    else:
        hf = AutoTokenizer.from_pretrained(path, **kw)
    vocab = hf.get_vocab()
    eos = {vocab[s] for s in _EOG_STRINGS if s in vocab}
    return Tokenizer(hf, eos)


def load_torch(spec: str, device: str = "cpu", threads: int | None = None, max_context: int | None = None,
               pack: str | None = None, tokenizer: Tokenizer | None = None):
    """(TorchRunner, Tokenizer) for a model spec; fp32 on CPU. pack: TorchRunner's packed-linear
    mode ("off", "hybrid", "full", "onednn"; None or "single" chooses). `tokenizer`: the model's,
    already loaded (load_runner)."""
    import torch
    from transformers import AutoModelForCausalLM

    from draftwise.backends.torch_runner import TorchRunner

    if threads:
        torch.set_num_threads(threads)
    if str(device).startswith("cuda"):  # before the weights load
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(str(device).partition(":")[2] or 0) >= n:
            raise ValueError(f"device {str(device)!r}: torch sees {n} GPU(s) here")
    src = resolve(spec)
    path, kw = _hf_args(src)
    dtype = torch.float32 if str(device) == "cpu" else torch.bfloat16
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    with gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
    tok = tokenizer if tokenizer is not None else load_tokenizer(src)  # not `or`: a Tokenizer has a length
    return TorchRunner(model, max_context=max_context, device=device, pack=pack), tok


def load_llama(spec: str, threads: int | None = None, n_ctx: int | None = None, n_batch: int | None = None,
               n_seq_max: int | None = None, device: str | None = None, fast_kernels: bool = False,
               trees: bool = False, tokenizer: Tokenizer | None = None):
    """(LlamaRunner, Tokenizer) for a GGUF model spec (packaged name or .gguf path).
    fast_kernels: llama.cpp's repacked-weight kernels, faster but not batch-invariant
    (backends/llama_runner.py). `tokenizer`: the model's, already loaded (load_runner)."""
    from draftwise.backends.llama_runner import LlamaRunner

    if device not in (None, "cpu"):
        raise ValueError(f"this llama.cpp build runs on the CPU only; got device={device!r}")
    src = resolve(spec)
    if src.kind != "gguf":
        raise ValueError(f"the llama.cpp backend needs a GGUF model, but {spec!r} is a {src.kind} "
                         f"({src.path}); pass a .gguf file or a packaged name, or use the torch backend")
    runner = LlamaRunner(src.path, n_ctx=n_ctx, n_batch=n_batch or 512, n_seq_max=n_seq_max or (1 if trees else 4),
                         n_threads=threads, extra_bufts=fast_kernels, trees=trees)
    return runner, tokenizer if tokenizer is not None else load_tokenizer(src)


def load_onnx(spec: str, threads: int | None = None, max_context: int | None = None,
              tokenizer: Tokenizer | None = None):
    """(OrtRunner, Tokenizer) on ONNX Runtime GenAI: a runtime model directory, or a packaged name,
    .gguf file or Hugging Face directory converted once into the cache (models/ort_convert.py)."""
    try:
        from draftwise.backends.ort_runner import OrtRunner
    except ImportError as e:
        from draftwise.extras import install_command

        raise ImportError(f"the onnx backend needs the onnx extra: {install_command('onnx')} (missing: {e.name})",
                          name=e.name) from None
    from draftwise.models.ort_convert import is_ort_dir, ort_model_dir

    model_dir = ort_model_dir(spec)
    if tokenizer is None:  # the source's own tokenizer (a GGUF's), as the other backends load it
        direct = is_ort_dir(Path(spec).expanduser())
        tokenizer = load_tokenizer(ModelSource(spec, "hf_dir", str(model_dir)) if direct else resolve(spec))
    return OrtRunner(model_dir, max_context=max_context, n_threads=threads), tokenizer


BACKENDS = ("torch", "llama.cpp", "onnx")


def torch_device(device: str | None) -> str:
    """The device a torch model loads on: the one named, else a GPU when torch sees one."""
    if device is not None:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_backend(spec: str, device: str | None = None) -> str:
    """llama.cpp for GGUF models running on the CPU (`device`, torch_device), torch otherwise."""
    if (spec.endswith(".gguf") or spec in PACKAGED) and torch_device(device) == "cpu":
        try:
            import llama_cpp  # noqa: F401
            return "llama.cpp"
        except ImportError:
            pass
    return "torch"


def load_runner(spec: str, backend: str = "torch", threads: int | None = None,
                max_context: int | None = None, tokenizer: Tokenizer | None = None, **backend_kw):
    """(runner, tokenizer) for a model spec on the named backend. `tokenizer`: the model's, when
    the caller loaded it first (to check it before loading the weights); else it is loaded."""
    if backend == "torch":
        return load_torch(spec, device=torch_device(backend_kw.get("device")), threads=threads, max_context=max_context,
                          pack=backend_kw.get("pack"), tokenizer=tokenizer)
    if backend == "llama.cpp":
        return load_llama(spec, threads=threads, n_ctx=max_context, tokenizer=tokenizer, **backend_kw)
    if backend == "onnx":
        return load_onnx(spec, threads=threads, max_context=max_context, tokenizer=tokenizer)
    raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
