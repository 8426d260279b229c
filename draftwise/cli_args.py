"""The command line's shared arguments: model and drafting flags, value checks, the engine spec."""
from __future__ import annotations

import argparse
import os
from pathlib import Path


def _model_args(p: argparse.ArgumentParser, drafting: bool = True) -> None:
    """The model flags, defined once for every command (defaults: draftwise.build.EngineSpec)."""
    from draftwise.build import AUTO_MEMBERS, DRAFTERS, EngineSpec, ModelFields

    d = EngineSpec.__dataclass_fields__
    p.add_argument("--target", default=d["target"].default, help="packaged name, .gguf file or HF directory")
    if drafting:
        p.add_argument("--drafter", choices=DRAFTERS, default=d["drafter"].default,
                       help="ngram: prompt lookup; suffix: suffix tries over the request and recent outputs; "
                       "suffix-tree: the same, proposing candidate trees (torch backend); "
                       "model: the draft model; head: a draft head on the target's features (--head); auto: one of "
                       "--auto-members or none, chosen every round (with D auto); none: plain decoding")
        p.add_argument("--num-draft-tokens", type=_draft_len, default=d["num_draft_tokens"].default,
                       help="D per round: an integer, or auto (default): chosen every round from the measured "
                            "forward-cost curves and the request's acceptance, 0 (plain) included")
    p.add_argument("--draft-model", default=d["draft_model"].default)
    p.add_argument("--backend", choices=("torch", "llama.cpp", "onnx", "auto"), default=None,
                   help="default: llama.cpp for GGUF models without a GPU (if installed), else torch; onnx: "
                   "ONNX Runtime GenAI, the model converted to int4 once on first use (docs/design.md, CPU backends); "
                   "auto: when drafting, llama.cpp or onnx (if installed), whichever's measured forwards of "
                   "1..8 tokens cost less on this machine")
    p.add_argument("--draft-backend", choices=("torch", "llama.cpp", "onnx"), default=None, help="default: the target's")
    p.add_argument("--device", default=None, help="torch models: cpu, cuda or cuda:N (bf16 on a GPU, fp32 on the "
                   "CPU); default: a GPU when torch sees one")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--max-context", type=int, default=None, help="tokens per sequence")
    p.add_argument("--n-batch", type=int, default=None, help="llama.cpp: tokens per decode call (default 512)")
    p.add_argument("--kernels", choices=("auto", "repacked", "standard"), default=d["kernels"].default,
                   help="llama.cpp: repacked kernels step one token faster and process long prompts slower; "
                   "auto (default): repacked for plain decoding, and when drafting the kernels whose measured "
                   "forwards of 1..8 tokens are faster on this machine (docs/usage.md)")
    p.add_argument("--head", default=None, help="head drafter: a packaged head's name or a head directory "
                   "(draftwise's or an EAGLE-3 checkpoint); default: the target's packaged head")
    p.add_argument("--ngram-min", type=int, default=d["ngram_min"].default)
    p.add_argument("--ngram-max", type=int, default=d["ngram_max"].default)
    p.add_argument("--suffix-max-nodes", type=int, default=d["suffix_max_nodes"].default,
                   help="suffix drafter: nodes of its trie over recent outputs (~270 bytes each); the oldest "
                        "request's output is evicted past it")
    p.add_argument("--auto-members", type=_members, default=d["auto_members"].default,
                   help="drafter auto: the drafters it chooses among each round, comma-separated, of ngram, "
                        f"suffix, model, head, prediction (default {','.join(AUTO_MEMBERS)})")
    assert set(ModelFields.__dataclass_fields__) <= {a.dest for a in p._actions}


def _prompt_cache_arg(p: argparse.ArgumentParser, default: int | None, default_text: str | None = None) -> None:
    p.add_argument("--prompt-cache-mb", type=_count, default=default,
                   help="MiB of finished prompts' KV kept (least recently used evicted) so that a later prompt "
                        f"sharing a prefix with one prefills only the rest; 0: off (default {default_text or default})")


def _members(text: str) -> tuple[str, ...]:
    return tuple(m.strip() for m in text.split(",") if m.strip())


def _draft_len(text: str) -> int | str:
    from draftwise.request import check_draft_len

    try:
        return check_draft_len(text if text == "auto" else int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or 'auto', got {text!r}") from None


def _int_in(lo: int, hi: int | None = None, what: str = ""):
    """An argparse type: an integer in [lo, hi], else an error naming the range."""
    what = what or f"an integer >= {lo}"

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            n = None
        if n is None or n < lo or (hi is not None and n > hi):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return n
    return parse


_positive, _count, _port = _int_in(1), _int_in(0), _int_in(0, 65535, "a port number 0..65535")


def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = float("nan")
    if not 0 < x < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return x


def _writable(path: str | None, directory: bool = False) -> None:
    """Refuse an output path that cannot be written before any work is done (a result computed
    first would be lost): a directory, or the nearest folder above it that exists, must be a
    writable directory; a file is opened for appending (and removed again if this made it)."""
    if path is None:
        return
    p = Path(path)
    if directory:
        if p.exists() and not p.is_dir():
            raise ValueError(f"output directory {path} exists and is not a directory")
        above = next(q for q in (p, *p.parents) if q.exists())
        if not above.is_dir() or not os.access(above, os.W_OK | os.X_OK):
            raise ValueError(f"output directory {path}: {above} is not a writable directory")
        return
    if p.is_dir():
        raise ValueError(f"output file {path} is a directory")
    existed = p.exists()
    with open(p, "a"):
        pass
    if not existed:
        p.unlink()


def _spec(a, **kw):
    from draftwise.build import EngineSpec, ModelFields

    fields = {f: getattr(a, f) for f in ModelFields.__dataclass_fields__}
    drafting = {f: getattr(a, f) for f in ("drafter", "num_draft_tokens", "max_running", "prompt_cache_mb")
                if hasattr(a, f)}
    return EngineSpec(**fields, **{**drafting, **kw})
