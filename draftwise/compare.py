"""Output checks: where two token sequences diverge, and how close the target's call was there."""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from draftwise.sampling import mask_logits


@dataclass(slots=True)
class Divergence:
    position: int  # index in the output where the two differ
    plain_token: int | None
    spec_token: int | None
    margin_single: float  # target's top-1 minus top-2 logit there, one token per forward
    margin_batched: float  # the same from one forward over prompt + common prefix

    def to_dict(self) -> dict:
        return asdict(self)


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def top2_margin(row: torch.Tensor) -> float:  # row: [V]
    top = torch.topk(row.float(), 2).values
    return float(top[0] - top[1])


def divergence_report(runner, prompt_ids: list[int], plain_ids: list[int], spec_ids: list[int],
                      grammar=None) -> Divergence | None:
    """None when identical; otherwise the first divergence with the target's top-2 margin there,
    computed both ways (a near-zero margin means batched and single-token rounding can flip it).
    `grammar` (draftwise.grammar.Grammar): the outputs were constrained, so the margin is taken
    over the tokens its mask allows after the common prefix, as decoding chose among them."""
    i = first_divergence(plain_ids, spec_ids)
    if i is None:
        return None
    allowed = None
    if grammar is not None:
        c = grammar.start()
        c.advance(plain_ids[:i])
        allowed = c.allowed()  # [V] bool
    prefix = prompt_ids + plain_ids[:i]
    seq = runner.new_sequence()
    try:
        batched = runner.forward([seq], [prefix], [1])[0][-1]  # [V]
        runner.truncate(seq, len(prompt_ids) - 1)
        row = runner.forward([seq], [prompt_ids[-1:]], [1])[0][-1]
        for tok in plain_ids[:i]:
            row = runner.forward([seq], [[tok]], [1])[0][-1]
    finally:
        runner.free(seq)
    if allowed is not None:  # the rows as constrained decoding saw them
        row, batched = mask_logits(torch.stack([row, batched]), allowed.expand(2, -1))
    at = lambda ids: ids[i] if i < len(ids) else None  # noqa: E731
    return Divergence(i, at(plain_ids), at(spec_ids), top2_margin(row), top2_margin(batched))
