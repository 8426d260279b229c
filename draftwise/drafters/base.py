"""The drafter interface: propose up to n tokens that continue a context."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch

from draftwise.backends.base import ModelRunner
from draftwise.sampling import SamplingParams


@dataclass(slots=True)
class Proposal:
    tokens: list[int]  # [d] proposed tokens, d <= the number asked for (may be 0)
    probs: torch.Tensor | None = None  # [d, V] draft probabilities q after warping; None = one-hot
    confidence: list[float] | None = None  # [d] the drafter's own probability of each token, if known
    forwards: int = 0  # draft-model forwards run for it (d, or d + 1 after it dropped a token); 0: no model
    stop_confidence: float | None = None  # after an early stop: the drafter's probability of the last token it drafted
    options: dict[str, Proposal] | None = None  # drafter auto: each member's proposal, by drafter name
    # a candidate tree: [d] each token's parent, an earlier index or -1 (it follows the context);
    # None: a chain. Nodes come best first (confidence non-increasing), so any head is a tree
    parents: list[int] | None = None

    def first(self, d: int) -> Proposal:
        """The first d tokens of this proposal, with their probabilities, confidences and parents."""
        if d == len(self.tokens):
            return self
        return Proposal(self.tokens[:d], None if self.probs is None else self.probs[:d],
                        None if self.confidence is None else self.confidence[:d],
                        parents=None if self.parents is None else self.parents[:d])

    @property
    def is_tree(self) -> bool:
        """Some token is not its predecessor's child: verification must follow the parents."""
        return self.parents is not None and any(p != i - 1 for i, p in enumerate(self.parents))

    def draft_probs(self, vocab_size: int) -> torch.Tensor:
        """q as a [d, vocab_size] tensor: the drafter's own, zero-padded to the target's width, or one-hot."""
        if self.probs is None:
            q = torch.zeros(len(self.tokens), vocab_size)
            q[torch.arange(len(self.tokens)), torch.tensor(self.tokens, dtype=torch.long)] = 1.0
            return q
        if self.probs.shape[1] < vocab_size:  # draft head narrower than the target's padded vocab
            return torch.nn.functional.pad(self.probs, (0, vocab_size - self.probs.shape[1]))
        return self.probs[:, :vocab_size]


@dataclass(slots=True)
class StopRule:
    """Early stop inside a draft, from the drafter's own probability c_j of each token j it drafts
    (1-based): c_j < go_on[j-1] stops drafting at token j (no forward for token j+1); the token a
    draft stops at (early, or the d-th) is then dropped if c_j < keep[j-1] (verifying it would cost
    more than it is expected to give), else kept. The go-on bar comes first: on a verify curve that
    is not convex the first token alone may never pay its verification while the start of a long
    draft does.
    The planner derives both from its cost model (Planner.plan)."""
    keep: list[float]  # [d]
    go_on: list[float]  # [d - 1]

    def drops(self, i: int, conf: float) -> bool:
        """Token i (0-based), where drafting stops, with the draft's probability conf is dropped."""
        return i < len(self.keep) and conf < self.keep[i]

    def ends_at(self, i: int, conf: float) -> bool:
        """Drafting stops at token i (0-based): no forward for the next one."""
        return i < len(self.go_on) and conf < self.go_on[i]


class Masker(Protocol):
    """A request's grammar as a drafter with a model sees it (draftwise.grammar.Constraint): the
    mask after the draft's tokens so far, those tokens held until the loop rolls them back."""

    def extend(self, tokens: list[int]) -> torch.Tensor: ...  # [V] bool, after these tokens too


class DraftItem(NamedTuple):
    """One request's draft in a lockstep `propose_many`: `num_tokens` after `context`, early-stopped
    by `stop`; under a grammar (`masker`), each token drawn from q masked by the grammar's mask
    after the tokens drafted before it (q' = norm(q * mask): a draft the grammar never cuts)."""
    seq_key: int
    context: list[int]
    num_tokens: int
    params: SamplingParams
    generator: torch.Generator | None
    stop: StopRule | None = None
    masker: Masker | None = None


class Drafter(Protocol):
    """Drafters are stateless towards the engine: `context` is the whole committed sequence
    (prompt + output) at every call; a drafter with its own state reconciles it with `context`
    itself. `seq_key` identifies the request, so one drafter serves several in flight.

    `cheap`: proposing costs next to nothing (n-gram), so the planner may look at a proposal
    before choosing how much of it to verify; a drafter that is not cheap has a model `runner`
    and drafts for several requests in lockstep with `propose_many`. `stop` (optional, drafters
    with their own probabilities): when to stop drafting early, see StopRule. `pending` is how
    many context tokens the drafter has not yet seen (what its next propose must catch up on);
    `ready` whether it can draft after the context now (a head also needs the target's features).
    `release(seq_key, context)`: the request ended; `context` is its prompt and delivered output
    (up to its EOS or stop), including the last round's tokens, which no propose saw; None: the
    drafter keeps what its proposals saw.
    `isolate(seq_key)`: the request's text is neither read from nor added to state shared across
    requests (the suffix drafter's global trie); `memory_nodes()`: the size of that shared state.
    `predict(seq_key, tokens, start)`: the request's predicted output (OpenAI's Predicted Outputs;
    empty: it has none), its output beginning at context index `start`; called for every request
    as it starts. Drafters that do not draft from predictions (all but drafters.prediction, and
    auto over it) ignore it."""

    name: str
    max_context: int | None  # most tokens the drafter can hold, None = unbounded
    cheap: bool
    runner: ModelRunner | None  # the draft model's runner; None for a cheap drafter
    runners: tuple[ModelRunner, ...]  # every model runner it drafts with (auto: several); their slots bound the batch
    tree: bool  # it proposes candidate trees: the target runner must verify trees
    # the target features it drafts from (ModelRunner.forward_features' layers), which it takes
    # with `observe`; None: it reads none
    features: list[int] | None

    def propose(self, seq_key: int, context: list[int], num_tokens: int,
                params: SamplingParams, generator: torch.Generator | None,
                stop: StopRule | None = None) -> Proposal: ...

    def propose_many(self, items: list[DraftItem]) -> list[Proposal]: ...  # not cheap: see ModelDrafter

    def pending(self, seq_key: int, context: list[int]) -> int: ...

    def ready(self, seq_key: int, context: list[int]) -> bool: ...  # not cheap: see ModelDrafter

    def observe(self, seq_key: int, start: int, feats: torch.Tensor) -> None: ...  # features only: [n, F]

    def isolate(self, seq_key: int) -> None: ...

    def predict(self, seq_key: int, tokens: list[int], start: int) -> None: ...

    def release(self, seq_key: int, context: list[int] | None = None) -> None: ...

    def memory_nodes(self) -> int: ...


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, compared in C
        return n
    lo, hi = 0, n  # binary search on prefix equality
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
