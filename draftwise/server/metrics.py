"""Prometheus metrics of the server: vLLM's names where vLLM has one (so its dashboards and
`draftwise bench --endpoint` read them), `draftwise:` names for the rest.

The metrics object is the scheduler's observer (draftwise.observer.Observer): the loop thread calls
it as it works.
Latencies are the server's view from the request's arrival: TTFT to the first committed token,
ITL between consecutive chunks (a speculative step delivers several tokens in one chunk),
E2E to the last token.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from draftwise.request import GenerationResult

_LAT = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_SEQS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


class ServerMetrics:
    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        m = ["model_name"]
        self._m = model_name
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Verification rounds (drafts verified).", m, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Proposed draft tokens.", m, registry=r)
        self.accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Accepted draft tokens.", m, registry=r)
        self.accepted_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                    "Accepted draft tokens per draft position.", m + ["position"], registry=r)
        self.proposed_pos = Counter("draftwise:spec_decode_num_proposed_tokens_per_pos",
                                    "Proposed draft tokens per draft position (D varies by request).",
                                    m + ["position"], registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.", m, buckets=_LAT, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Time between consecutive chunks.", m,
                             buckets=_LAT, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", m, buckets=_LAT,
                             registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prompt tokens of finished requests.", m, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Emitted tokens of finished requests.", m,
                                         registry=r)
        self.success = Counter("vllm:request_success", "Finished requests.", m + ["finished_reason"], registry=r)
        self.running = Gauge("vllm:num_requests_running", "Requests in the running batch.", m, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests in the waiting queue.", m, registry=r)
        self.rejected = Counter("draftwise:requests_rejected", "Requests refused (bad input, no key, queue full, "
                                "loading, ...).", m + ["reason"], registry=r)
        self.cancelled_n = Counter("draftwise:requests_cancelled", "Requests cancelled (client gone).", m,
                                   registry=r)
        self.failed_n = Counter("draftwise:requests_failed", "Requests that failed in the scheduler.", m,
                                registry=r)
        self.faults = Counter("draftwise:scheduler_faults", "Batched forwards that failed (kind forward|draft: "
                              "each sequence retried alone) and steps that failed outside every request (loop).",
                              m + ["kind"], registry=r)
        self.held_seqs = Gauge("draftwise:sequences_held", "Target sequences open, one per running request: "
                               "more is a leak.", m, registry=r)
        self.drafter_nodes = Gauge("draftwise:drafter_shared_nodes", "Nodes of the drafter's state shared across "
                                   "requests (the suffix drafter's global trie), capped by eviction.", m, registry=r)
        self.cache_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prompt cache.",
                                     m, registry=r)
        self.cache_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens whose KV the prompt cache supplied.", m,
                                  registry=r)
        self.cache_bytes = Gauge("draftwise:prompt_cache_bytes", "Bytes of prompt KV kept by the prompt cache "
                                 "(capped by --prompt-cache-mb).", m, registry=r)
        self.cache_entries = Gauge("draftwise:prompt_cache_entries", "Prompts kept by the prompt cache.", m,
                                   registry=r)
        self.forward_seqs = Histogram("draftwise:forward_sequences", "Sequences carried by one target forward.",
                                      m + ["kind"], buckets=_SEQS, registry=r)
        self.forward_tokens = Counter("draftwise:forward_tokens", "Tokens fed to target forwards.", m + ["kind"],
                                      registry=r)
        self.phase_s = Counter("draftwise:step_seconds", "Scheduler time by phase: prefill, draft, "
                               "verify (target forward), other (acceptance, commit, detokenising).",
                               m + ["phase"], registry=r)
        for c in (self.drafts, self.draft_tokens, self.accepted):  # present (at 0) before the first round
            c.labels(model_name)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # --- the scheduler's observer ----------------------------------------------------------------

    def forward(self, kind: str, n_seqs: int, n_tokens: int, seconds: float) -> None:
        self.forward_seqs.labels(self._m, kind).observe(n_seqs)
        self.forward_tokens.labels(self._m, kind).inc(n_tokens)

    def round(self, proposed: int, accepted: int, positions: int) -> None:
        """`proposed` tokens (a candidate tree's nodes) reaching `positions` draft positions (its depth)."""
        self.drafts.labels(self._m).inc()
        self.draft_tokens.labels(self._m).inc(proposed)
        self.accepted.labels(self._m).inc(accepted)
        for i in range(positions):
            self.proposed_pos.labels(self._m, str(i)).inc()
            self.accepted_pos.labels(self._m, str(i)).inc(1 if i < accepted else 0)

    def cache(self, queried: int, hit: int) -> None:
        self.cache_queries.labels(self._m).inc(queried)
        self.cache_hits.labels(self._m).inc(hit)

    def phase(self, name: str, seconds: float) -> None:
        self.phase_s.labels(self._m, name).inc(seconds)

    def queue(self, waiting: int, running: int) -> None:
        self.waiting.labels(self._m).set(waiting)
        self.running.labels(self._m).set(running)

    def finished(self, req, result: GenerationResult) -> None:
        m = self._m
        self.ttft.labels(m).observe(result.ttft_s)
        times = result.chunk_times_s
        for a, b in zip(times, times[1:]):
            self.itl.labels(m).observe(b - a)
        self.e2e.labels(m).observe(times[-1] if times else result.ttft_s)
        self.prompt_tokens.labels(m).inc(result.prompt_tokens)
        self.generation_tokens.labels(m).inc(len(result.token_ids))
        self.success.labels(m, result.finish_reason).inc()

    def failed(self, req, error: BaseException) -> None:
        self.failed_n.labels(self._m).inc()

    def fault(self, kind: str) -> None:
        self.faults.labels(self._m, kind).inc()

    def held(self, n: int) -> None:
        self.held_seqs.labels(self._m).set(n)

    def prompt_cache(self, nbytes: int, entries: int) -> None:
        self.cache_bytes.labels(self._m).set(nbytes)
        self.cache_entries.labels(self._m).set(entries)

    def drafter_state(self, nodes: int) -> None:
        self.drafter_nodes.labels(self._m).set(nodes)

    def cancelled(self, req) -> None:
        self.cancelled_n.labels(self._m).inc()

    def reject(self, reason: str) -> None:
        self.rejected.labels(self._m, reason).inc()
