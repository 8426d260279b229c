"""Packaged draft heads: trained here with `draftwise train-head`, kept in the repository
(draftwise/heads/NAME/: config.json and a bf16 model.safetensors), SHA-256 checked at load.

A head spec is a packaged head's name, or a directory holding a head (draftwise's or an EAGLE-3
checkpoint in vLLM / SGLang's layout); None picks the packaged head of the target.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

HEADS_DIR = Path(__file__).resolve().parent.parent / "heads"


@dataclass(frozen=True, slots=True)
class PackagedHead:
    name: str
    target: str  # the packaged target it reads
    sha256: str  # of model.safetensors


PACKAGED_HEADS: dict[str, PackagedHead] = {h.name: h for h in (
    PackagedHead("qwen2.5-coder-1.5b-head", "qwen2.5-coder-1.5b",
                 "3a0d7b718122fa578e065b698506af7586f980db182c367c2b1f38bf7c379db0"),
)}


def resolve_head(spec: str | None, target: str) -> Path:
    """The directory of the head `spec` names (see the module docstring)."""
    if spec is None:
        for h in PACKAGED_HEADS.values():
            if h.target == target:
                return _checked(h)
        raise ValueError(f"no packaged head for target {target!r} (packaged: "
                         f"{', '.join(f'{h.name} for {h.target}' for h in PACKAGED_HEADS.values()) or 'none'}); "
                         "pass --head DIR (draftwise train-head makes one)")
    if spec in PACKAGED_HEADS:
        return _checked(PACKAGED_HEADS[spec])
    path = Path(spec)
    if not path.is_dir():
        raise FileNotFoundError(f"head {spec!r} is neither a packaged head ({', '.join(PACKAGED_HEADS) or 'none'}) "
                                "nor a directory")
    return path


def _checked(h: PackagedHead) -> Path:
    path = HEADS_DIR / h.name
    got = hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()
    if got != h.sha256:
        raise ValueError(f"packaged head {h.name}: model.safetensors has SHA-256 {got}, expected {h.sha256}")
    return path
