"""Candidate trees on llama.cpp (LlamaRunner with `trees=True`): the KV is one unified stream, where
a cell may belong to several sequence ids. Each leaf of a tree gets a branch sequence id that first
shares the request's cells (llama_memory_seq_cp, bookkeeping only); each new token carries the ids
of the leaves below it and sits at position length + its depth, so llama.cpp's mask (same sequence
id, position not after the token's) lets it see its ancestors only. `keep` copies the accepted
path's cells from a branch to the request's id and hands every branch's cells to the request's
graveyard id, freed with the request: a freed cell before a sequence's newer ones would take its
next token, and llama.cpp's CPU flash attention then computes otherwise (measured on SmolLM2: a
token written into such a hole got logits 0.7 away from the same token appended; bit-identical
with flash attention off, which drifts in other ways). For the same reason a runner with trees
holds one sequence at a time (another's freed cells would be such holes), and twice n_ctx cells,
the rest for rejected branches.
"""
from __future__ import annotations

import llama_cpp as _ll

from draftwise.backends.base import tree_layout

GRAVEYARD = 1  # the sequence id holding rejected branches' cells until the sequence is freed
# branch sequence ids for a tree's leaves. The suffix drafter's leaves are an antichain of scores
# >= min_score summing to <= 1: at most 10 at its default 0.1
MAX_LEAVES = 16


class Tree:
    """A fed candidate tree: per fed token its parent, depth and the leaves below it; the leaves'
    branch sequence ids once assigned."""

    def __init__(self, parents: list[int]):
        self.parents = parents
        self.depth, sees = tree_layout(parents)
        inner = set(parents)
        leaves = [j for j in range(len(parents)) if j not in inner]
        self.below: list[list[int]] = [[] for _ in parents]  # [n] the leaves under each node
        for x in leaves:
            for j in sees[x]:
                self.below[j].append(x)
        self.leaf_ids: dict[int, int] = {}

    @classmethod
    def of(cls, parents: list[int]) -> Tree:
        if sum(p < 0 for p in parents) != 1 or parents[0] != -1:
            raise ValueError("a fed tree has one root, its first token")
        t = cls(parents)
        if len(t.below[0]) > MAX_LEAVES:
            raise ValueError(f"a tree of {len(t.below[0])} leaves: at most {MAX_LEAVES}")
        return t

    def assign(self, free: list[int], mem, seq: int) -> None:
        """A branch id per leaf, each sharing every cell of `seq` (bookkeeping in a unified KV)."""
        for x in self.below[0]:
            self.leaf_ids[x] = b = free.pop()
            _ll.llama_memory_seq_cp(mem, seq, b, -1, -1)
