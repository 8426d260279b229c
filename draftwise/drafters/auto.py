"""`--drafter auto`: the loaded drafters side by side; the `auto` policy (draftwise.choice.DrafterChoice)
verifies, each round, the one whose plan promises the most tokens per second, or none.

Cheap members (n-gram, suffix) propose every round, since looking costs next to nothing: their
summed call time is the round's drafting time. Members with a model (the draft model, the head)
draft only when chosen, after the choice, for the D the plan gave (`modelled`, `draft_many`); one that
sat out rounds first catches up on the tokens it has not seen, a cost the plan prices (its
`pending`). A head receives the target's features of the steps that ask for them (`observe`): the
rounds it drafts, a plain step when its plan would draft but it lacks the context's (`ready`), and
every step on torch, where they come free with the forward (draftwise.drafters.head)."""
from __future__ import annotations

import torch

from draftwise.drafters.base import Drafter, Proposal, StopRule
from draftwise.sampling import SamplingParams


class AutoDrafter:
    name = "auto"
    cheap = True  # proposed before the choice; its members with a model after it (DrafterChoice.draft)
    runner = None
    tree = False  # its members propose chains (build.AUTO_CHOICES)

    def __init__(self, members: dict[str, Drafter], base: str | None = None):
        if not members:
            raise ValueError("drafter auto needs at least one drafter to choose from")
        if base is not None and base not in members:
            raise ValueError(f"drafter auto's base {base!r} is not among its members {', '.join(members)}")
        self.members = members
        # a configured drafter composed with the prediction (build.with_prediction): the member
        # drafting requests without a prediction alone, as it would uncomposed; None: --drafter auto
        self.base = base
        self.name = base or "auto"
        self.cheap_members = {n: d for n, d in members.items() if d.cheap}
        self.modelled = {n: d for n, d in members.items() if not d.cheap}
        heads = [d for d in self.modelled.values() if d.features is not None]
        if len(heads) > 1:
            raise ValueError("drafter auto takes one head")
        self.head = heads[0] if heads else None
        self.features = self.head.features if self.head else None  # what the target must return
        self.runners = tuple(d.runner for d in self.modelled.values())
        limits = [d.max_context for d in self.modelled.values() if d.max_context is not None]
        self.max_context = min(limits) if limits else None

    def propose(self, seq_key: int, context: list[int], num_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, stop: StopRule | None = None) -> Proposal:
        """No tokens of its own: each cheap member's proposal in `options`, by name."""
        return Proposal([], options={n: d.propose(seq_key, context, num_tokens, params, generator)
                                     for n, d in self.cheap_members.items()})

    def draft_many(self, name: str, items: list[tuple]) -> list[Proposal]:
        """The chosen member with a model's drafts (ModelDrafter.propose_many's items)."""
        return self.modelled[name].propose_many(items)

    def observe(self, seq_key: int, start: int, feats: torch.Tensor) -> None:
        if self.head is not None:
            self.head.observe(seq_key, start, feats)

    def pending(self, seq_key: int, context: list[int]) -> int:
        return 0

    def isolate(self, seq_key: int) -> None:
        for d in self.members.values():
            d.isolate(seq_key)

    def predict(self, seq_key: int, tokens: list[int], start: int) -> None:
        for d in self.members.values():
            d.predict(seq_key, tokens, start)

    def release(self, seq_key: int, context: list[int] | None = None) -> None:
        for d in self.members.values():
            d.release(seq_key, context)

    def memory_nodes(self) -> int:
        return sum(d.memory_nodes() for d in self.members.values())
