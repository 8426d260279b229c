"""The single-request front over the decoding loop (draftwise.scheduler): `generate` / `stream`
submit one request and run the loop's steps in the caller's thread until it ends.

Plain decoding is the same loop with no drafter (every step is a plain step), so the baseline and
speculation share every other line.
"""
from __future__ import annotations

from collections.abc import Iterator

from draftwise.backends.base import ModelRunner
from draftwise.drafters.base import Drafter
from draftwise.planner import Planner
from draftwise.policy import DraftPolicy
from draftwise.policy_build import make_policy
from draftwise.request import Chunk, GenerationResult, Request, check_draft_len
from draftwise.sampling import SamplingParams
from draftwise.scheduler import Scheduler
from draftwise.tokenizer import Tokenizer
from draftwise.verify import rejection_sample, rejection_sample_tree

__all__ = ["Engine", "Chunk", "GenerationResult"]


class Engine:
    """`num_draft_tokens` is a fixed D, or "auto": the planner picks D (0 included) every round
    (`planner`, or one made over the runners' measured cost curves). `sampler` is the acceptance
    rule at temperature > 0 (swappable only so that `draftwise verify` can show it catches a wrong
    one). With `reuse_prefix`, the last prompt's KV state (target and drafter) is kept for the
    next request with the same prompt; `prompt_cache_bytes` > 0 keeps copies of finished prompts'
    target KV for later prompts sharing a prefix (draftwise.prompt_cache). `requests` runs several
    at once, batched."""

    scheduler_class = Scheduler

    def __init__(self, target: ModelRunner, tokenizer: Tokenizer, drafter: Drafter | None = None,
                 num_draft_tokens: int | str = 4, sampler=rejection_sample, tree_sampler=rejection_sample_tree,
                 reuse_prefix: bool = False, prompt_cache_bytes: int = 0,
                 planner: Planner | None = None, policy: DraftPolicy | None = None, max_running: int = 16):
        self.target, self.tokenizer, self.drafter = target, tokenizer, drafter
        self.num_draft_tokens = check_draft_len(num_draft_tokens)
        self.policy = policy or make_policy(self.num_draft_tokens, target, drafter, planner=planner)
        self.scheduler = self.scheduler_class(target, tokenizer, drafter, self.policy, max_running=max_running,
                                              max_queue=1 << 30, sampler=sampler, tree_sampler=tree_sampler,
                                              reuse_prefix=reuse_prefix, prompt_cache_bytes=prompt_cache_bytes)

    @property
    def max_draft(self) -> int:
        """The most draft tokens a round may propose (what the context must leave room for)."""
        return self.scheduler.max_draft

    def generate(self, prompt: str | list[int], **kwargs) -> GenerationResult:
        """Run a request to its end; kwargs as for stream()."""
        for chunk in self.stream(prompt, **kwargs):
            if chunk.result is not None:
                return chunk.result
        raise RuntimeError("generation ended without a result")

    def stream(self, prompt: str | list[int], max_tokens: int = 128, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int | None = None,
               stop: list[str] | None = None, num_draft_tokens: int | None = None,
               logprobs: int | None = None, private: bool = False,
               prediction: str | list[int] | None = None, constraint=None) -> Iterator[Chunk]:
        """One request's chunks as they are committed. An integer `num_draft_tokens` fixes D for this
        request; None (or "auto") keeps the engine's. `private`: the drafter neither reads nor keeps
        its text in state shared across requests (the suffix drafter's global trie). `prediction`:
        the expected output (text or token ids), drafted from where the drafter takes predictions.
        `constraint`: a draftwise.grammar.Grammar the output follows (a JSON schema, json_object)."""
        events: list = []
        req = self.request(prompt, events.append, max_tokens, temperature, top_p, top_k, seed, stop,
                           num_draft_tokens, logprobs, private, prediction, constraint)
        self.scheduler.validate(req)  # bad input fails here, before the first chunk is asked for
        return self._events(req, events)

    def request(self, prompt: str | list[int], deliver, max_tokens: int = 128, temperature: float = 0.0,
                top_p: float = 1.0, top_k: int = 0, seed: int | None = None, stop: list[str] | None = None,
                num_draft_tokens: int | None = None, logprobs: int | None = None, private: bool = False,
                prediction: str | list[int] | None = None, constraint=None) -> Request:
        """A Request for this engine's loop (not yet submitted)."""
        params = SamplingParams(temperature, top_p, top_k, seed)
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if num_draft_tokens == "auto":
            num_draft_tokens = None  # the engine's own policy
        if isinstance(prediction, str):
            prediction = self.tokenizer.encode(prediction)
        return Request(ids, max_tokens, params, deliver, list(stop or []), num_draft_tokens, logprobs,
                       private=private, prediction=list(prediction) if prediction else None, constraint=constraint)

    def _events(self, req: Request, events: list) -> Iterator[Chunk]:
        done = False
        self.scheduler.submit(req)
        try:
            while not done:  # a step's two halves, each chunk yielded as soon as it is committed
                for half in (self.scheduler.admit, self.scheduler.decode):
                    half()
                    for ev in events:
                        if isinstance(ev, BaseException):
                            raise ev
                        done = ev.result is not None
                        yield ev
                    events.clear()
        finally:  # also runs when the consumer stops early: the request's KV state is freed
            if not done:
                self.scheduler.abort(req)

    def run_batch(self, requests: list[Request]) -> None:
        """Run several requests to their ends in one batched loop (events go to each one's deliver)."""
        for r in requests:
            self.scheduler.submit(r)
        while any(self.scheduler.counts()):
            self.scheduler.step()

    def release(self) -> None:
        """Free the prompt state kept by `reuse_prefix` (target and drafter sequences)."""
        self.scheduler.release()
