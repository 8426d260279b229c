"""`--drafter auto`: every loaded cheap drafter proposes each round, side by side; the `auto`
policy (draftwise.policy.DrafterChoice) verifies the one whose plan promises the most tokens per
second, or none. Proposing from all of them costs their summed call time, which the policy prices
as the round's drafting time; switching between cheap drafters costs nothing else (none of them
falls behind: each reads the whole context at every call)."""
from __future__ import annotations

import torch

from draftwise.drafters.base import Drafter, Proposal, StopRule
from draftwise.sampling import SamplingParams


class AutoDrafter:
    name = "auto"
    max_context = None
    cheap = True
    runner = None

    def __init__(self, members: dict[str, Drafter]):
        if not members:
            raise ValueError("drafter auto needs at least one drafter to choose from")
        dear = [n for n, d in members.items() if not d.cheap]
        if dear:
            raise ValueError(f"drafter auto chooses among cheap drafters (n-gram, suffix); {', '.join(dear)} is not")
        self.members = members

    def propose(self, seq_key: int, context: list[int], num_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, stop: StopRule | None = None) -> Proposal:
        """No tokens of its own: each member's proposal in `options`, by name."""
        return Proposal([], options={n: d.propose(seq_key, context, num_tokens, params, generator)
                                     for n, d in self.members.items()})

    def pending(self, seq_key: int, context: list[int]) -> int:
        return 0

    def isolate(self, seq_key: int) -> None:
        for d in self.members.values():
            d.isolate(seq_key)

    def release(self, seq_key: int) -> None:
        for d in self.members.values():
            d.release(seq_key)

    def memory_nodes(self) -> int:
        return sum(d.memory_nodes() for d in self.members.values())
