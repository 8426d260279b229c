"""The model-runner interface: the one owner of a model's KV state, for several sequences."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch


@dataclass(slots=True)
class KVState:
    """A copy of one sequence's KV state, `n` tokens (`ModelRunner.save`)."""
    n: int
    nbytes: int
    data: object  # the runner's own: llama.cpp's serialized sequence, torch's cache copy


@dataclass(frozen=True, slots=True)
class Weights:
    """What a bench record says of a runner's weights (`ModelRunner.weights`)."""
    bytes: int | None  # torch's parameters in memory, or the weight files on disk; None: unknown
    precision: str  # "bfloat16", "gguf:FILE", "onnx:DIR"
    kernels: str | None = None  # which linear kernels run them, where there is a choice


def torch_weights(model, kernels: str | None = None) -> Weights:
    """Weights of a torch module: its parameters' bytes and dtype."""
    params = list(model.parameters())
    return Weights(sum(p.numel() * p.element_size() for p in params), str(params[0].dtype).removeprefix("torch."), kernels)


class Forward(NamedTuple):
    """What `forward_features` returns, per sequence."""
    logits: list[torch.Tensor]  # [k, vocab_size] each, as forward's
    features: list[torch.Tensor]  # [m, F] each: the target's features of the feed's last m >= k tokens


class ModelRunner(Protocol):
    """Forward new tokens for one or more sequences; truncate or free each sequence's KV state.

    A sequence's KV state holds the tokens forwarded so far, in order; `length(seq)` counts them.
    Rollback is explicit: `truncate(seq, n)` keeps the first n tokens. Nothing else edits it.

    Candidate trees (`trees` True): `forward` takes, per sequence, the parent of each new token
    among its new tokens (-1: the tokens before them), so each new token attends to the sequence
    so far and its own ancestors only, at position length + its depth; after verification
    `keep(seq, n, rows)` keeps the first n tokens and then the tokens at `rows` (ascending, >= n),
    which become positions n, n+1, ...

    Prompt caching (`saves` True): `save(seq)` copies the sequence's KV state out; `restore(seq,
    state)` gives an empty sequence that state.

    Target features (`returns_features` True), what a draft head reads: `forward_features` is
    `forward` that also returns, per sequence, the features named by `layers` ([]: the last
    layer's normed state; [i, ...]: the inputs of layers i, ... concatenated, EAGLE-3) of at
    least the rows that get logits; nothing is set on the runner between calls.
    """

    vocab_size: int  # width of the logits rows
    max_context: int  # most tokens one sequence may hold
    backend: str  # "torch" or "llama.cpp"
    n_seq_max: int | None  # most sequences held at once (llama.cpp's streams), None = unbounded
    trees: bool  # forward takes `parents` and `keep` compacts: candidate trees can be verified
    saves: bool  # save and restore copy a sequence's KV state out and back: prompts can be cached
    returns_features: bool  # forward_features works: a draft head can draft on this target
    features_free: bool  # features come with every forward at no extra work (torch's hidden states)

    def new_sequence(self) -> int: ...

    def forward(
        self,
        seq_ids: list[int],
        tokens: list[list[int]],  # new tokens per sequence, appended to its KV state
        num_logits: list[int],  # per sequence: logits for the last k of its new tokens
        parents: list[list[int] | None] | None = None,  # per sequence: None (a chain) or [n] (trees only)
    ) -> list[torch.Tensor]:  # per sequence: [k, vocab_size] float32 on the CPU
        ...

    def forward_features(self, seq_ids: list[int], tokens: list[list[int]], num_logits: list[int],
                         layers: list[int], parents: list[list[int] | None] | None = None) -> Forward:
        ...  # returns_features only

    def forward_parts(self, ks: list[int]) -> list[tuple[int, int]]:
        """The forwards, (k tokens per sequence, b sequences) each, that one batched forward of
        these per-sequence token counts runs as: what a cost curve measured on even batches
        prices it by (padded_parts for a runner that splits nothing)."""
        ...

    def truncate(self, seq_id: int, n: int) -> None: ...

    def keep(self, seq_id: int, n: int, rows: list[int]) -> None: ...  # trees only

    def length(self, seq_id: int) -> int: ...

    def free(self, seq_id: int) -> None: ...

    def kv_bytes(self) -> int: ...  # bytes of KV state held now, all sequences

    def identity(self) -> dict | None: ...  # what its cost curve depends on besides the machine; None: not cached

    def weights(self) -> Weights: ...  # what a bench record says of its weights

    def save(self, seq_id: int) -> KVState: ...  # saves only

    def restore(self, seq_id: int, state: KVState) -> None: ...  # saves only; into an empty sequence


def check_forward_args(seq_ids: list[int], tokens: list[list[int]], num_logits: list[int]) -> None:
    if not (len(seq_ids) == len(tokens) == len(num_logits)):
        raise ValueError("seq_ids, tokens and num_logits must have one entry per sequence")
    for toks, k in zip(tokens, num_logits):
        if not toks:
            raise ValueError("each sequence in a forward needs at least one new token")
        if not 0 <= k <= len(toks):
            raise ValueError(f"num_logits {k} must be within [0, {len(toks)}] new tokens")


def tree_layout(parents: list[int]) -> tuple[list[int], list[list[int]]]:
    """(depth of each new token, the new tokens each one attends to: its ancestors and itself)."""
    depth, sees = [], []
    for j, p in enumerate(parents):
        if not -1 <= p < j:
            raise ValueError(f"new token {j}'s parent {p} must be in [-1, {j - 1}]")
        depth.append(0 if p < 0 else depth[p] + 1)
        sees.append(([] if p < 0 else sees[p]) + [j])
    return depth, sees


def padded_parts(ks: list[int]) -> list[tuple[int, int]]:
    """One forward of max(ks) tokens for every sequence: a batch padded to its longest feed."""
    return [(max(ks), len(ks))]


def equal_split_parts(ks: list[int]) -> list[tuple[int, int]]:
    """Forwards of equally many tokens of each sequence in them (llama.cpp's split_equal, one KV
    stream per sequence): every sequence's first min(ks) tokens, then the longer sequences' next
    tokens up to the next length, and so on: (k, b) per forward."""
    parts, done = [], 0
    for i, k in enumerate(sorted(ks)):
        if k > done:
            parts.append((k - done, len(ks) - i))
            done = k
    return parts


def file_identity(path: str, **settings) -> dict:
    """identity() of a runner whose weights are one file: the file (path, size, mtime) and the
    settings its cost curve depends on."""
    st = os.stat(path)
    return {"model": os.path.abspath(path), "size": st.st_size, "mtime": int(st.st_mtime), **settings}
