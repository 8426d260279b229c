"""Suffix drafting: continuations of the context's suffix, counted in a suffix trie over the
request's own tokens and in a global one over recent requests' outputs (SuffixDecoding).

Each trie holds every substring of up to `depth` tokens of the sequences inserted, with how
often it occurred. To propose, the context's last m tokens (m = max_match down to min_match) are
looked up in both tries, the longest match with a continuation winning (then the higher score;
then the trie the request's last draft came from if the target's tokens since followed it, else
the other, the global one first: a prompt and an earlier output can share a passage and part ways
after it; an earlier output is what the target itself wrote after it, and after that the copy the
target is following is the one that was right last). From the node reached, the draft follows
the most frequent child at each step, each token scored by its frequency among its siblings
times its parent's score (an estimate of the chance the whole prefix so far is right), and stops
where the score falls below `min_score`.

A request's first chain (its opening) is chosen differently. Its context ends in the prompt's
last tokens, which the global trie holds for earlier prompts too (prompts sharing a template and
an instruction match there for 9-11 tokens whatever their answers were), so the length of that
match says how alike the prompts end, not whether the answers will be. There each trie drafts on
its own, and the chain of the trie whose opening chain the target followed further in the last
request where the two differed (`opening`; the global one until then) is proposed, the other's if
it has none: over different edits it learns to copy the request's own prompt, and when the same
prompts come again, the earlier answers.
The tries hold substrings of up to `depth` tokens, so a walk from an m-token match ends after
depth - m tokens; there the draft re-anchors on its own last max_match tokens (context + draft) and
walks on, its scores carrying on, so a long copied passage (an agent asking again) drafts as far
as the planner wants.

With `tree=True` (drafter name `suffix-tree`) the draft is a candidate tree instead: the
highest-scoring continuations below the matched node, best first (`grow`), so where the most
frequent path is uncertain its runners-up are verified in the same forward. Where the tries' depth
cuts the tree's deepest path and budget is left, that path re-anchors and goes on as a chain.

Example: the request so far is [5 6 7 9 5 6 7 9 5 6]; the suffix [5 6] occurred twice before,
followed by 7 both times, then 9 both times: proposing 3 tokens gives [7 9 5], scores [1, 1, 1].

The global trie keeps the outputs of the last requests (each after its prompt's last tokens) up to
`max_nodes` trie nodes (~270 bytes each in CPython: 200,000 nodes ~ 54 MB), evicting the oldest
request's tokens first. A request in
`private` neither reads nor feeds it.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from draftwise.backends.base import tree_layout
from draftwise.drafters.base import Proposal, StopRule, common_prefix
from draftwise.sampling import SamplingParams


class SuffixTrie:
    """Counts of every substring of up to `depth` tokens of the sequences added. Adding a token
    extends the (at most depth - 1) suffixes that end before it: O(depth) per token.

    Nodes are integer ids (the root is 0): `kids[i]` maps a token to its child's id and `count[i]`
    is how often node i's substring occurred. Dicts holding only ints are never tracked by Python's
    cyclic garbage collector, so a trie of any size adds two lists to what a full collection walks
    (one object per node would add a few hundred thousand: docs/data/trie_gc.txt). Ids of removed
    nodes are reused."""

    def __init__(self, depth: int):
        self.depth, self.nodes = depth, 1
        self.kids: list[dict[int, int]] = [{}]
        self.count: list[int] = [0]
        self._free: list[int] = []

    def _new(self) -> int:
        self.nodes += 1
        if self._free:
            i = self._free.pop()
            self.kids[i], self.count[i] = {}, 0
            return i
        self.kids.append({})
        self.count.append(0)
        return len(self.kids) - 1

    def extend(self, active: list[int], t: int, sign: int = 1) -> list[int]:
        """Count token t after the suffixes `active` (their nodes, shortest first); returns the
        nodes of the suffixes that now end at t and can still grow. sign -1 uncounts, dropping
        nodes whose count reaches 0 (their own children reach 0 as the same sequence is uncounted)."""
        out = []
        for node in [0] + active:
            kids = self.kids[node]
            child = kids.get(t)
            if child is None:
                if sign < 0:
                    continue
                child = kids[t] = self._new()
            self.count[child] += sign
            if self.count[child] <= 0:
                del kids[t]
                self.nodes -= 1
                self._free.append(child)
            out.append(child)
        return out[: self.depth - 1]

    def add(self, seq: list[int], sign: int = 1) -> None:
        active: list[int] = []
        for t in seq:
            active = self.extend(active, t, sign)

    def find(self, pattern: list[int]) -> int | None:
        node = 0
        for t in pattern:
            node = self.kids[node].get(t)
            if node is None:
                return None
        return node


def walk(trie: SuffixTrie, node: int, n: int, min_score: float, score: float = 1.0) -> tuple[list[int], list[float]]:
    """The most frequent path below `node`, up to n tokens, while its score stays >= min_score.
    A token's score is its count over its siblings' (the occurrences that continued at all) times
    its parent's score (`score` above the first)."""
    tokens, scores = [], []
    count = trie.count
    while len(tokens) < n and (kids := trie.kids[node]):
        total = sum(count[c] for c in kids.values())
        t, child = max(kids.items(), key=lambda kv: count[kv[1]])
        score *= count[child] / total
        if score < min_score:
            break
        tokens.append(t)
        scores.append(score)
        node = child
    return tokens, scores


def grow(trie: SuffixTrie, node: int, n: int, min_score: float) -> tuple[list[int], list[float], list[int]]:
    """(tokens, scores, parents): the n highest-scoring nodes below `node` with score >= min_score,
    best first (a parent's score is at least its children's, so parents come first and any head of
    the list is a tree); scores as in `walk`, parents index into the list, -1 for `node`'s children."""
    tokens, scores, parents = [], [], []
    heap: list[tuple[float, int, int, int, int]] = []  # (-score, tie-break, token, node, parent)
    order = 0
    count = trie.count

    def push(nd: int, score: float, parent: int) -> None:
        nonlocal order
        kids = trie.kids[nd]
        total = sum(count[c] for c in kids.values())
        for t, child in kids.items():
            heapq.heappush(heap, (-score * count[child] / total, order, t, child, parent))
            order += 1
    push(node, 1.0, -1)
    while heap and len(tokens) < n:
        neg, _, t, child, parent = heapq.heappop(heap)
        if -neg < min_score:
            break
        tokens.append(t)
        scores.append(-neg)
        parents.append(parent)
        push(child, -neg, len(tokens) - 1)
    return tokens, scores, parents


def best_first(tokens: list[int], scores: list[float], parents: list[int]):
    """The same tree reordered by score, highest first (stable: a parent, never below its
    children, stays before them), parents renumbered."""
    order = sorted(range(len(tokens)), key=lambda i: -scores[i])
    new = {old: j for j, old in enumerate(order)}
    return ([tokens[i] for i in order], [scores[i] for i in order],
            [new[parents[i]] if parents[i] >= 0 else -1 for i in order])


@dataclass(slots=True)
class _Request:
    trie: SuffixTrie
    prompt_len: int
    seen: list[int] = field(default_factory=list)  # context tokens inserted so far
    active: list[int] = field(default_factory=list)  # the nodes of the suffixes ending at its last token
    last: list[int] = field(default_factory=list)  # the last chain proposed
    source: int = 1  # the trie it came from: 0 the request's, 1 the global one
    prefer: int = 1  # the trie that wins a tie: `source` if the target followed `last`, else the other
    openers: list[list[int]] | None = None  # the first chain of each trie (request's, global), until judged


class SuffixDrafter:
    name = "suffix"
    max_context = None
    cheap = True
    runner, runners = None, ()
    features = None

    def __init__(self, depth: int = 24, max_match: int = 12, min_match: int = 2, min_score: float = 0.1,
                 max_nodes: int = 200_000, share: bool = True, tree: bool = False):
        if not 1 <= min_match <= max_match <= depth:
            raise ValueError(f"suffix drafter needs 1 <= min_match <= max_match <= depth, got "
                             f"{min_match}, {max_match}, {depth}")
        if not 0.0 <= min_score <= 1.0 or max_nodes < 1:
            raise ValueError(f"need 0 <= min_score <= 1 and max_nodes >= 1, got {min_score}, {max_nodes}")
        self.depth, self.max_match, self.min_match, self.min_score = depth, max_match, min_match, min_score
        self.max_nodes, self.share, self.tree = max_nodes, share, tree
        self.name = "suffix-tree" if tree else "suffix"
        self.global_trie = SuffixTrie(depth)
        self._outputs: OrderedDict[int, list[int]] = OrderedDict()  # what the global trie holds, oldest first
        self._reqs: dict[int, _Request] = {}
        self.private: set[int] = set()  # request keys that neither read nor feed the global trie
        self.opening = 1  # the trie the target followed further at the last judged opening: 0 the request's, 1 global

    def propose(self, seq_key: int, context: list[int], num_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, stop: StopRule | None = None) -> Proposal:
        r = self._reqs.get(seq_key)
        if r is None or context[: len(r.seen)] != r.seen:  # new, or another sequence under this key
            r = self._reqs[seq_key] = _Request(SuffixTrie(self.depth), len(context) - 1, prefer=self.opening)
        new = context[len(r.seen):]
        if r.last and new:  # did the target follow the last draft as far as it went?
            followed = common_prefix(new, r.last) == min(len(new), len(r.last))
            r.prefer = r.source if followed else 1 - r.source
            r.last = []
        if r.openers and new:  # the opening judged once the target has parted from either first chain
            out = context[r.prompt_len + 1:]
            own, glob = (common_prefix(out, o) for o in r.openers)
            if own != glob:  # the shorter one ended or missed: the other was followed further
                self.opening, r.openers = int(glob > own), None
            elif all(own == len(o) for o in r.openers) or own < len(out):  # both ended, or missed at once
                r.openers = None
        for t in new:
            r.active = r.trie.extend(r.active, t)
        r.seen += new
        if num_tokens <= 0:
            return Proposal([])
        tries = [r.trie] + ([self.global_trie] if self.share and seq_key not in self.private else [])
        if len(tries) > 1 and r.prefer == 1:
            tries.reverse()  # the first trie wins a tie (_match)
        if not self.tree and len(tries) > 1 and len(r.seen) <= r.prompt_len + 1:  # the request's opening
            chains = [self._chain([t], context, num_tokens, 1.0)[:2] for t in (r.trie, self.global_trie)]
            r.openers = [c[0] for c in chains] if chains[0][0] and chains[1][0] else None
            r.source = self.opening if chains[self.opening][0] else 1 - self.opening
            tokens, scores = chains[r.source]
            r.last = tokens
            return Proposal(tokens, confidence=scores or None)
        if not self.tree:
            tokens, scores, first = self._chain(tries, context, num_tokens, 1.0)
            r.last, r.source = tokens, int(first is self.global_trie)
            return Proposal(tokens, confidence=scores or None)
        # a tree: the trie of the best walk (ties as for the request's last chain; trees set none)
        m, _, _, node, trie = self._match(tries, context[-self.max_match:], num_tokens, 1.0)
        if node is None:
            return Proposal([])
        tokens, scores, parents = grow(trie, node, num_tokens, self.min_score)
        depth, sees = tree_layout(parents)  # 0-based depth; each node's path from the root
        if len(tokens) < num_tokens and m + max(depth) + 1 >= self.depth:  # the deepest path was cut by the depth
            leaf = depth.index(max(depth))
            more, sc, _ = self._chain(tries, context + [tokens[i] for i in sees[leaf]], num_tokens - len(tokens),
                                   scores[leaf])
            if more:  # a chain below the leaf: its first token's parent is the leaf, then each the previous
                parents += [leaf] + list(range(len(tokens), len(tokens) + len(more) - 1))
                tokens, scores, parents = best_first(tokens + more, scores + sc, parents)
        return Proposal(tokens, confidence=scores or None, parents=parents)

    def _chain(self, tries: list[SuffixTrie], context: list[int], n: int, score: float):
        """(tokens, scores, trie): up to n tokens walked below the context's best match, re-anchoring
        on context + draft wherever the tries' depth cuts a walk; scores carry on from `score`;
        `trie`: the one the first walk came from (None: no match)."""
        tokens: list[int] = []
        scores: list[float] = []
        first = None
        while len(tokens) < n:
            m, toks, sc, _, trie = self._match(tries, context[-self.max_match:] + tokens, n - len(tokens),
                                               scores[-1] if scores else score)
            first = first or trie
            tokens += toks
            scores += sc
            if not toks or m + len(toks) < self.depth:  # not cut by the depth: the draft ends here
                break
        return tokens, scores, first

    def _match(self, tries: list[SuffixTrie], tail: list[int], n: int, score: float):
        """(m, tokens, scores, node, trie): the walk below the longest suffix of `tail` (m tokens, at
        `node` of `trie`) with a continuation in any trie, the higher summed score on a tie, then the
        earlier trie in `tries`; scores carry on from `score`."""
        best: tuple = (0, 0.0, [], [], None, None)
        for trie in tries:
            for m in range(min(self.max_match, len(tail)), max(self.min_match, best[0]) - 1, -1):
                node = trie.find(tail[-m:])
                toks, sc = walk(trie, node, n, self.min_score, score) if node is not None else ([], [])
                if toks:
                    best = max(best, (m, sum(sc), toks, sc, node, trie), key=lambda b: b[:2])  # first of equals
                    break
        return best[0], best[2], best[3], best[4], best[5]

    def pending(self, seq_key: int, context: list[int]) -> int:
        return 0

    def predict(self, seq_key: int, tokens: list[int], start: int) -> None:
        pass  # drafts from its own source only

    def isolate(self, seq_key: int) -> None:
        self.private.add(seq_key)

    def release(self, seq_key: int, context: list[int] | None = None) -> None:
        """A request ended with `context`: its output joins the global trie (unless private), oldest
        evicted past the cap, after the last max_match - 1 tokens of its prompt: the same prompt
        asked again drafts from its first token on, to its last (the last round's tokens, which no
        propose saw, included)."""
        r = self._reqs.pop(seq_key, None)
        private = seq_key in self.private
        self.private.discard(seq_key)
        if r is None or private or not self.share:
            return
        seen = context if context is not None and context[: len(r.seen)] == r.seen else r.seen
        out = seen[max(r.prompt_len - self.max_match + 1, 0):]  # with its prompt's last tokens
        if len(out) < 2:
            return
        self.global_trie.add(out)
        self._outputs[seq_key] = out
        while self.global_trie.nodes > self.max_nodes and self._outputs:
            _, old = self._outputs.popitem(last=False)
            self.global_trie.add(old, sign=-1)

    def memory_nodes(self) -> int:
        """Nodes in the global trie (its size against `max_nodes`)."""
        return self.global_trie.nodes
