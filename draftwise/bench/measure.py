"""Measuring one request as the user sees it: chunk arrival times, memory, and the engine's stats.

All latencies come from the harness's own clock around the stream (not the engine's), so the
in-process engine and a server are timed the same way:
- TTFT: request start -> first chunk that carries tokens
- ITL (inter-token latency as seen): gaps between consecutive chunks that carry tokens; one
  speculative round delivers several tokens in one chunk, so its gap covers all of them
- E2E: request start -> last chunk
"""
from __future__ import annotations

import importlib.metadata
import json
import platform
import threading
import time

import psutil

from draftwise.engine import Engine
from draftwise.prompts import Prompt

_PACKAGES = ("draftwise", "torch", "transformers", "numpy", "llama-cpp-python", "gguf", "psutil", "matplotlib")


class RssSampler:
    """Resident memory sampled by a background thread while a request runs. The process's peak
    RSS only ever grows, so it cannot tell configurations apart; the peak *during* each request can."""

    def __init__(self, interval_s: float = 0.01):
        self.interval_s, self.peak, self.start = interval_s, 0, 0
        self._proc, self._stop = psutil.Process(), threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RssSampler:
        self.start = self.peak = self._proc.memory_info().rss
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


def timing_fields(t_chunks: list[float], end: float) -> dict:
    """Seconds since request start of each chunk with tokens, and the request's end."""
    itl = [b - a for a, b in zip(t_chunks, t_chunks[1:])]
    return {"ttft_s": t_chunks[0] if t_chunks else None, "itl_s": itl, "e2e_s": end, "chunk_times_s": t_chunks}


class _Record:
    """One request's chunk arrival times and result, collected by its deliver callback."""

    def __init__(self, target: EngineTarget):
        self.target, self.t_chunks, self.result, self.error = target, [], None, None

    def deliver(self, ev) -> None:
        now = time.perf_counter()
        if isinstance(ev, BaseException):
            self.error = ev
            return
        if ev.token_ids:
            self.t_chunks.append(now)
        if ev.result is not None:
            self.result, self.end = ev.result, now
        else:
            self.target.probe_kv()  # the last chunk comes after the KV is freed


class SchemaGrammars:
    """The grammars of response_format schemas for one target runner (its tokenizer and logits
    width), each compiled once however many configurations and requests ask for it."""

    def __init__(self, tokenizer, vocab_size: int):
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._compiler = None  # draftwise.grammar.Grammars, made on the first schema
        self._compiled: dict[str, object] = {}  # schema JSON -> Grammar

    def __call__(self, response_format: dict):
        """The Grammar a response_format asks for; None for text."""
        from draftwise.grammar import Grammars, format_schema

        schema = format_schema(response_format)
        if schema is None:
            return None
        key = json.dumps(schema, sort_keys=True)
        if key not in self._compiled:
            self._compiler = self._compiler or Grammars(self._tokenizer, self._vocab_size)
            self._compiled[key] = self._compiler.json_schema(schema)
        return self._compiled[key]


class EngineTarget:
    """Runs a group of requests on an in-process Engine, together in its batched loop: a group of
    `concurrency` requests shares every target forward, as on a server."""

    sequential = False

    def __init__(self, engine: Engine, kv_probe: bool = True, grammars: SchemaGrammars | None = None):
        self.engine = engine
        self.grammars = grammars or SchemaGrammars(engine.tokenizer, engine.target.vocab_size)
        # KV bytes are read at each chunk (tens of microseconds); the time is stored as probe_s
        self.kv_probe = kv_probe
        self.draft_runner = engine.drafter.runner if engine.drafter is not None else None
        self.kv = self.dkv = 0
        self.probe_s = 0.0

    def forget_prompts(self) -> None:
        """Empty the engine's prompt cache, if it has one."""
        if self.engine.scheduler.prompt_cache is not None:
            self.engine.scheduler.prompt_cache.clear()

    def probe_kv(self) -> None:
        if self.kv_probe:
            tp = time.perf_counter()
            self.kv = max(self.kv, self.engine.target.kv_bytes())
            if self.draft_runner is not None:
                self.dkv = max(self.dkv, self.draft_runner.kv_bytes())
            self.probe_s += time.perf_counter() - tp

    def run_group(self, requests: list[tuple[Prompt, list[int], dict]]) -> tuple[list[dict], None]:
        """requests: (prompt, its token ids, stream kwargs) each; one record per request, in order."""
        self.kv = self.dkv = 0
        self.probe_s = 0.0
        recs = [_Record(self) for _ in requests]
        t_group = time.perf_counter()  # before the requests arrive (their t0): queue_s >= 0
        reqs = [self.engine.request(ids, rec.deliver, **self._constrained(kw)) for (_, ids, kw), rec in zip(requests, recs)]
        with RssSampler() as rss:
            self.engine.run_batch(reqs)
        d = self.engine.drafter
        nodes = d.memory_nodes() if d is not None else None  # shared drafter state after the group
        out = []
        for req, rec in zip(reqs, recs):
            if rec.error is not None:
                raise rec.error
            r = rec.result
            t0 = req.t0
            out.append({**timing_fields([t - t0 for t in rec.t_chunks], rec.end - t0), "queue_s": t0 - t_group,
                        "emitted_tokens": len(r.token_ids), "token_ids": r.token_ids, "text": r.text,
                        "finish_reason": r.finish_reason, "prompt_tokens": r.prompt_tokens,
                        "stats": r.stats.to_dict(), "rss_start_bytes": rss.start, "rss_peak_bytes": rss.peak,
                        "kv_peak_bytes": self.kv if self.kv_probe else None,
                        "draft_kv_peak_bytes": self.dkv if self.kv_probe and self.draft_runner is not None else None,
                        "probe_s": self.probe_s / len(reqs), "drafter_nodes": nodes,
                        **({"decisions": [list(p) for p in r.decisions]} if r.decisions is not None else {})})
        return out, None

    def _constrained(self, kw: dict) -> dict:
        """A request's kwargs with its response_format as the grammar it decodes under."""
        if kw.get("response_format") is None:
            return kw
        grammar = self.grammars(kw["response_format"])
        return {k: v for k, v in kw.items() if k != "response_format"} | {"constraint": grammar}

    def describe(self) -> dict:
        d, target = self.engine.drafter, self.engine.target.weights()
        return {"sequential": False, "backend": self.engine.target.backend,
                "precision": target.precision, "kernels": target.kernels,
                "drafter": d.name if d is not None else None,
                "num_draft_tokens": self.engine.num_draft_tokens if d else 0,
                "draft_weight_bytes": self.draft_runner.weights().bytes if self.draft_runner is not None else None,
                "target_weight_bytes": target.bytes}


def environment() -> dict:
    """Package versions, machine and threads, stored with every run."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    from draftwise.machine import cpu_model

    cpu = cpu_model() or platform.processor()
    threads = None
    try:
        import torch
        threads = torch.get_num_threads()
    except ImportError:
        pass
    return {"packages": versions, "python": platform.python_version(), "platform": platform.platform(),
            "machine": platform.machine(), "cpu": cpu, "logical_cpus": psutil.cpu_count(),
            "physical_cpus": psutil.cpu_count(logical=False), "ram_bytes": psutil.virtual_memory().total,
            "torch_threads": threads}
