"""Forward-cost profile: wall time of one runner.forward of k new tokens, logits at all k.

Verifying d draft tokens is one forward of k = d+1 tokens, so how that cost grows with k (and with
the number of sequences b sharing the forward) sets what speculation can gain: if k tokens cost
about as much as one, every accepted draft token is nearly free. Each measurement starts from the
same state: b sequences prefilled with `context_len` tokens, and truncated back after each forward.
Works with any ModelRunner (torch or llama.cpp).
"""
from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from draftwise.backends.base import ModelRunner
from draftwise.machine import cache_dir, cpu_model


@dataclass(slots=True)
class ProfileResult:
    rows: list[dict]  # {"batch": b, "k": k, "ms_median": float, "ms_all": [float, ...]}
    context_len: int
    backend: str
    repeats: int
    warmup: int
    meta: dict = field(default_factory=dict)

    def ms(self, batch: int, k: int) -> float:
        for r in self.rows:
            if r["batch"] == batch and r["k"] == k:
                return r["ms_median"]
        raise KeyError(f"no measurement for batch={batch}, k={k}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> ProfileResult:
        return cls(**json.loads(Path(path).read_text()))

    def format_table(self) -> str:
        """Per batch size: ms per forward, ms per new token (over all b*k), and the ratio to the
        smallest k measured (k=1 when present)."""
        k0 = min(r["k"] for r in self.rows)
        lines = [f"forward of k new tokens at context {self.context_len} ({self.backend}, "
                 f"median of {self.repeats})",
                 f"{'batch':>5} {'k':>4} {'ms':>9} {'ms/token':>9} {f'x k={k0}':>8}"]
        for b in sorted({r["batch"] for r in self.rows}):
            rows = sorted((r for r in self.rows if r["batch"] == b), key=lambda r: r["k"])
            base = rows[0]["ms_median"]
            for r in rows:
                per_tok = r["ms_median"] / (b * r["k"])
                ratio = r["ms_median"] / base if base > 0 else float("nan")
                lines.append(f"{b:>5} {r['k']:>4} {r['ms_median']:>9.2f} {per_tok:>9.3f} {ratio:>8.2f}")
        return "\n".join(lines)


def profile_runner(runner: ModelRunner, ks: Iterable[int] = range(1, 18),
                   batch_sizes: Sequence[int] = (1, 2, 4), context_len: int = 256,
                   repeats: int = 5, warmup: int = 1, tokens: Sequence[int] | None = None,
                   seed: int = 0) -> ProfileResult:
    """Median wall time of `runner.forward` over b sequences x k new tokens, logits at all k.

    tokens: the context to prefill (its first context_len ids); random ids from `seed` if None.
    The k new tokens are random ids too: forward cost does not depend on which tokens they are.
    """
    ks = sorted(set(int(k) for k in ks))
    batch_sizes = sorted(set(int(b) for b in batch_sizes))
    if not ks or ks[0] < 1 or not batch_sizes or batch_sizes[0] < 1:
        raise ValueError(f"ks and batch_sizes need values >= 1, got {ks} and {batch_sizes}")
    if repeats < 1 or warmup < 0 or context_len < 1:
        raise ValueError(f"need repeats >= 1, warmup >= 0 and context_len >= 1; "
                         f"got {repeats}, {warmup} and {context_len}")
    if context_len + ks[-1] > runner.max_context:
        raise ValueError(f"context_len {context_len} + k {ks[-1]} exceeds the runner's context of "
                         f"{runner.max_context} tokens")
    rng = np.random.default_rng(seed)
    if tokens is None:
        ctx = rng.integers(0, runner.vocab_size, context_len).tolist()
    else:
        ctx = [int(t) for t in tokens[:context_len]]
        if len(ctx) < context_len:
            raise ValueError(f"{len(tokens)} tokens given for a context of {context_len}")
    new = rng.integers(0, runner.vocab_size, (batch_sizes[-1], ks[-1])).tolist()  # [b_max, k_max]

    rows, prefill_ms = [], []
    for b in batch_sizes:
        seqs: list[int] = []
        try:
            for _ in range(b):
                seqs.append(runner.new_sequence())
                t0 = time.perf_counter()
                runner.forward([seqs[-1]], [ctx], [0])
                prefill_ms.append((time.perf_counter() - t0) * 1e3)
            feeds = {k: [new[i][:k] for i in range(b)] for k in ks}  # [b][k] each, built outside the timing
            times: dict[int, list[float]] = {k: [] for k in ks}
            for rep in range(warmup + repeats):  # passes over every k: a slow few seconds of the
                for k in ks:  # machine hits one repeat of several k, not every repeat of one k
                    t0 = time.perf_counter()
                    runner.forward(seqs, feeds[k], [k] * b)
                    dt = (time.perf_counter() - t0) * 1e3
                    for s in seqs:
                        runner.truncate(s, context_len)
                    if rep >= warmup:
                        times[k].append(dt)
            rows += [{"batch": b, "k": k, "ms_median": statistics.median(times[k]), "ms_all": times[k]} for k in ks]
        finally:
            for s in seqs:
                runner.free(s)
    own = runner.identity() or {}
    meta = {k: own[v] for k, v in (("n_threads", "n_threads"), ("model_path", "model")) if own.get(v) is not None}
    # one sequence's forward over the whole context: what catching up on many tokens costs
    meta["prefill"] = {"tokens": context_len, "ms_median": statistics.median(prefill_ms[1:] or prefill_ms)}
    return ProfileResult(rows, context_len, runner.backend, repeats, warmup, meta)


def machine_identity() -> dict:
    """What every cached measurement depends on: the machine."""
    import platform

    return {"machine": platform.machine(), "cpu": cpu_model(), "cores": os.cpu_count()}


def runner_identity(runner: ModelRunner) -> dict | None:
    """What a profile depends on besides the machine: backend, model file and settings; None when
    the runner cannot name its model (then its profile is not cached)."""
    own = runner.identity()
    if own is None:
        return None
    return {"backend": runner.backend, **machine_identity(), **own}


# how profile_runner measures, part of a cached profile's key: a curve measured another way is
# measured again. 2: repeats as passes over every k (1 timed each k's repeats back to back: on
# torch on 2 EPYC cores its cached 1.5B curve had k = 5 at 1.25x k = 1 where an interleaved
# measurement, and the running engine, have ~1.03x; docs/design.md, Measured cost curves)
METHOD = 2
CHOICE_PASSES = 3  # side-by-side passes of `cheapest`, after one that warms every runner up
CHOICE_CONTEXT = 256  # the context its forwards run at: the planner's curves' own


def _cache_file(kind: str, ident: dict, prefix: str = "") -> Path:
    """cache_dir()/kind/PREFIXhash.json for an identity (METHOD included by the caller)."""
    import hashlib

    return cache_dir() / kind / f"{prefix}{hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]}.json"


def _busy() -> bool:
    """Something else ran while this measured (the load average above 1.5x the cores): not cached."""
    return os.getloadavg()[0] > 1.5 * (os.cpu_count() or 1)


def cached_profile(runner: ModelRunner, batch_sizes: Sequence[int] = (1,), ks: Iterable[int] = range(1, 18),
                   context_len: int = 256, repeats: int = 5, log=None) -> ProfileResult:
    """The runner's forward-cost curve, measured once per model, settings, machine and METHOD and
    kept in the cache directory (deleting the file measures it again)."""
    ks = list(ks)
    context_len = min(context_len, runner.max_context - max(ks))
    ident = runner_identity(runner)
    path = None
    if ident is not None:
        ident.update(ks=ks, batch_sizes=list(batch_sizes), context_len=context_len, repeats=repeats,
                     method=METHOD)
        path = _cache_file("profiles", ident, f"{runner.backend}-")
        if path.is_file():
            return ProfileResult.load(path)
    if log and os.getloadavg()[0] > (os.cpu_count() or 1):
        log(f"warning: load average {os.getloadavg()[0]:.1f} exceeds {os.cpu_count()} cores: the curve "
            "measured now will be slow; delete it from the cache once the machine is quiet")
    if log:
        log(f"measuring the forward-cost curve of {ident.get('model') if ident else 'the model'} "
            f"({runner.backend}, k={ks[0]}..{ks[-1]}, batch {list(batch_sizes)}); kept for later runs")
    prof = profile_runner(runner, ks, batch_sizes, context_len, repeats=repeats, warmup=1)
    if path is not None and not _busy():
        prof.meta["identity"] = ident
        prof.save(path)
    elif path is not None and log:
        log(f"not caching the curve: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores says "
            "something else ran while it was measured; the next start measures it again")
    return prof


def _choice_file(key: dict | None, ks: Sequence[int]) -> Path | None:
    if key is None:
        return None
    return _cache_file("choices", {"candidates": key, "ks": list(ks), "passes": CHOICE_PASSES,
                                   "context_len": CHOICE_CONTEXT, "method": METHOD, **machine_identity()})


def remembered_choice(key: dict | None, ks: Sequence[int]) -> tuple[str, dict[str, float]] | None:
    """(name, ms by name) that `cheapest` measured before for these candidates on this machine;
    None if it has not (or `key` is None), so the caller loads only the winner of a kept choice."""
    path = _choice_file(key, ks)
    if path is None or not path.is_file():
        return None
    got = json.loads(path.read_text())
    return got["chosen"], got["ms"]


def cheapest(runners: dict[str, ModelRunner], ks: Sequence[int], key: dict | None = None,
             log=None) -> tuple[str, dict[str, float]]:
    """(name, ms by name): of several runners of one model, the one whose one-sequence forwards of
    `ks` tokens take least time in total (the sum over ks of each k's median). Their curves are
    measured side by side, in passes that take each runner in turn (a curve cached in another
    sitting of the machine is no measure against one taken now). The choice is kept in the cache
    under `key` (the caller's description of the candidates: read back by remembered_choice before
    anything is loaded) when the machine was quiet; key None: not kept."""
    if log:
        log(f"measuring {', '.join(runners)} side by side (forwards of {ks[0]}..{ks[-1]} tokens); kept for later runs")
    times: dict[str, dict[int, list[float]]] = {n: {k: [] for k in ks} for n in runners}
    for rep in range(CHOICE_PASSES + 1):  # pass 0 warms every runner up
        for n, r in runners.items():
            res = profile_runner(r, ks, (1,), context_len=min(CHOICE_CONTEXT, r.max_context - max(ks)),
                                 repeats=1, warmup=0, seed=rep)
            if rep:
                for row in res.rows:
                    times[n][row["k"]].append(row["ms_median"])
    ms = {n: round(sum(statistics.median(v) for v in t.values()), 1) for n, t in times.items()}
    chosen = min(ms, key=ms.get)
    path = _choice_file(key, ks)
    if path is not None and _busy():
        path = None
        if log:
            log("not caching the choice: something else ran while it was measured; the next start measures again")
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"chosen": chosen, "ms": ms, "candidates": key, "cpu": cpu_model()}, indent=1) + "\n")
    return chosen, ms
