"""The machine draftwise runs on: CPU model and flags, usable cores, and the cache directory.

The bottom layer: the standard library (and psutil) only, so any module may import it.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

CPUINFO = "/proc/cpuinfo"


@functools.lru_cache(maxsize=None)
def cpuinfo(path: str = CPUINFO) -> Mapping[str, str]:
    """`key: value` lines of /proc/cpuinfo, the first of each key (the first processor's, on x86);
    empty where the file does not exist (macOS, Windows)."""
    out: dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep:
                    out.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return MappingProxyType(out)  # read-only: every caller shares the one parse


def cpu_model(path: str = CPUINFO) -> str:
    """The CPU's model name, "" when unknown."""
    return cpuinfo(path).get("model name", "")


def cpu_flags(path: str = CPUINFO) -> frozenset[str]:
    """The CPU's feature flags ("avx2", "amx_tile", ...), empty when unknown."""
    return frozenset(cpuinfo(path).get("flags", "").split())


def physical_cores() -> int:
    """Physical cores this process may run on: llama.cpp gains nothing from SMT siblings."""
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        import psutil

        physical = psutil.cpu_count(logical=False) or allowed
    except ImportError:
        physical = allowed
    return max(1, min(physical, allowed))


def cache_dir() -> Path:
    """Where models, tokenizers, profiles and kernel choices are kept: DRAFTWISE_CACHE, else
    ~/.cache/draftwise; created on first use."""
    d = Path(os.environ.get("DRAFTWISE_CACHE", Path.home() / ".cache" / "draftwise"))
    d.mkdir(parents=True, exist_ok=True)
    return d
