"""A model as an ONNX Runtime GenAI directory (int4 weights for the CPU), converted once and cached.

A spec resolves to a runtime model directory in this order: a directory holding `genai_config.json`
is used as it is; a packaged name or a `.gguf` file is exported to a Hugging Face directory
(models/export.py) and that, like a local Hugging Face directory, is converted by the runtime's own
builder into `<cache>/onnx/<name>-<key>/`, once. The builder runs as a subprocess of the interpreter
that `DRAFTWISE_ORT_PYTHON` names (a converter venv whose pins differ from draftwise's), else of this
one; it needs torch, transformers, onnx and onnx-ir at conversion time, onnxruntime-genai only to run.

    python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT -p int4 -e cpu \\
        --extra_options accuracy_level=4

accuracy_level=4: the int4 MatMulNBits kernels quantise activations to int8 (VNNI), the fastest CPU
path; block size 32 (the builder's default). The output holds logits for every fed position (what
verification reads); `prune_lm_head` would keep only the last one.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from draftwise.machine import cache_dir

CONFIG = "genai_config.json"
PYTHON_ENV = "DRAFTWISE_ORT_PYTHON"
BUILDER = "onnxruntime_genai.models.builder"
BUILD_ARGS = ("-p", "int4", "-e", "cpu", "--extra_options", "accuracy_level=4")
BUILDER_MODULES = ("onnxruntime_genai", "onnx", "onnx_ir", "torch", "transformers")


class ConverterMissing(RuntimeError):
    pass


def is_ort_dir(path: str | Path) -> bool:
    return (Path(path).expanduser() / CONFIG).is_file()


def converter_python() -> str:
    return os.environ.get(PYTHON_ENV) or sys.executable


def check_converter(python: str) -> None:
    """Raise ConverterMissing naming what to install when `python` cannot run the builder."""
    code = ("import importlib.util, sys; m = [n for n in sys.argv[1:] if importlib.util.find_spec(n) is None]; "
            "print(' '.join(m)); sys.exit(1 if m else 0)")
    try:
        r = subprocess.run([python, "-c", code, *BUILDER_MODULES], capture_output=True, text=True, timeout=120)
    except OSError as e:
        raise ConverterMissing(f"{PYTHON_ENV}={python} cannot be run ({e}); point it at a venv's python") from None
    if r.returncode != 0:
        names = r.stdout.strip() or r.stderr.strip()[-200:]
        raise ConverterMissing(
            f"converting a model for the onnx backend needs onnxruntime-genai, onnx, onnx-ir, torch and "
            f"transformers in {python} (missing: {names}): {python} -m pip install onnxruntime-genai==0.18.0 "
            f"onnx onnx-ir, or set {PYTHON_ENV} to a venv's python that has them")


def _key(path: Path, args: tuple[str, ...]) -> str:
    """Which source and builder settings a converted directory came from."""
    st = path.stat()
    ident = {"source": str(path.resolve()), "size": st.st_size, "mtime": int(st.st_mtime), "args": list(args)}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _cached(spec: str, install: bool = True):
    """(the source's kind, its path, where its conversion lives in the cache)."""
    from draftwise.models.registry import resolve

    src = resolve(spec, install=install)
    if src.kind not in ("gguf", "hf_dir"):
        raise ValueError(f"the onnx backend converts a packaged name, a .gguf file or a local Hugging Face "
                         f"directory; {spec!r} is a {src.kind} ({src.path})")
    source = Path(src.path)
    name = source.stem if src.kind == "gguf" else source.name
    return src.kind, source, cache_dir() / "onnx" / f"{name}-{_key(source, BUILD_ARGS)}"


def converted_dir(spec: str) -> Path | None:
    """The runtime model directory for `spec` if it is one or is converted already, else None
    (nothing is installed or converted)."""
    if is_ort_dir(spec):
        return Path(spec).expanduser()
    try:
        out = _cached(spec, install=False)[2]
    except Exception:  # not installed, not found
        return None
    return out if is_ort_dir(out) else None


def ort_model_dir(spec: str, log=None) -> Path:
    """The runtime model directory for `spec`, converting (minutes, once) when it is not cached."""
    if is_ort_dir(spec):
        return Path(spec).expanduser()
    kind, source, out = _cached(spec)
    if is_ort_dir(out):
        return out
    python = converter_python()
    check_converter(python)
    log = log or (lambda m: print(m, file=sys.stderr))
    work = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        hf = source
        if kind == "gguf":  # draftwise's own export, as a command: models.export imports the loaders
            hf = work / "hf"
            log(f"onnx backend: exporting {spec} to a Hugging Face directory (once)")
            _run([sys.executable, "-m", "draftwise.cli", "models", "export-hf", str(source), str(hf),
                  "--dtype", "float32"], "draftwise models export-hf")
        log(f"onnx backend: converting {hf} to int4 with {BUILDER} (once, a few minutes)")
        cmd = [python, "-m", BUILDER, "-i", str(hf), "-o", str(work / "model"), "-c", str(work / "builder_cache"),
               *BUILD_ARGS]
        _run(cmd, "the onnxruntime-genai builder")
        if not is_ort_dir(work / "model"):
            raise RuntimeError(f"the onnxruntime-genai builder wrote no {CONFIG} into {work / 'model'}: {' '.join(cmd)}")
        (work / "model" / "source.json").write_text(json.dumps({"spec": spec, "source": str(source),
                                                                 "builder_args": list(BUILD_ARGS)}, indent=1) + "\n")
        try:
            os.replace(work / "model", out)  # atomic: a half-written directory is never taken for a model
        except OSError:
            if not is_ort_dir(out):  # else another process converted it first
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {r.returncode}): {' '.join(cmd)}\n{(r.stderr or r.stdout)[-2000:]}")
