"""llama.cpp around its runner (draftwise.backends.llama_runner): the library set up once per
process, the AMX check, llama.cpp's own tokenizer, and the embedding tables read from a GGUF file."""
from __future__ import annotations

import ctypes
import os

import llama_cpp as _ll
import torch

from draftwise.machine import cpu_flags

_LOG_CALLBACK = None  # must outlive every llama.cpp call: C keeps the bare pointer
_BACKEND_READY = False


def init_backend() -> None:
    """Silence llama.cpp's stderr chatter (unless DRAFTWISE_LLAMA_VERBOSE=1), once per process."""
    global _LOG_CALLBACK, _BACKEND_READY
    if _BACKEND_READY:
        return
    if os.environ.get("DRAFTWISE_LLAMA_VERBOSE") == "1":
        _ll.llama_log_set(ctypes.cast(None, _ll.llama_log_callback), None)  # NULL: its stderr logger
    else:
        _LOG_CALLBACK = _ll.llama_log_callback(lambda level, text, user_data: None)
        _ll.llama_log_set(_LOG_CALLBACK, None)
    _ll.llama_backend_init()
    _BACKEND_READY = True


def amx_would_crash() -> bool:
    """True when this llama.cpp build has AMX kernels and the CPU advertises AMX: in the Firecracker
    VMs seen here that combination segfaults on any multi-token batch (ggml_backend_amx_mul_mat).
    scripts/setup.sh builds without AMX on such CPUs, which keeps the repacked-weight kernels."""
    return b"AMX" in _ll.llama_print_system_info() and "amx_tile" in cpu_flags()


def llama_tokenize(vocab, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
    data = text.encode("utf-8")
    cap = len(data) + 16
    for _ in range(2):
        buf = (_ll.llama_token * cap)()
        n = _ll.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
        if n >= 0:
            return list(buf[:n])
        cap = -n  # too small: llama.cpp says how many it needs
    raise RuntimeError(f"llama_tokenize failed on {len(data)} bytes")


def gguf_embedding_tables(path: str, vocab_size: int):
    """(input embedding [V, H], rows(ids) -> the LM head's rows [len(ids), H]) as float32,
    dequantised from the GGUF file (the `gguf` package transformers' GGUF loader uses)."""
    import gguf
    from gguf.quants import dequantize

    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    emb = torch.from_numpy(dequantize(tensors["token_embd.weight"].data, tensors["token_embd.weight"].tensor_type))
    out = tensors.get("output.weight")  # absent: tied to the embedding
    lm = emb if out is None else torch.from_numpy(dequantize(out.data, out.tensor_type))
    return emb.reshape(vocab_size, -1).float(), lambda ids: lm.reshape(vocab_size, -1)[ids].float()
