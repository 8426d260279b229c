"""llama.cpp backend over llama-cpp-python's low-level C API: several sequences in one context.

KV scheme: one llama.cpp context per runner. Each sequence is a llama.cpp sequence id with its own
KV stream (`kv_unified=False`), so `n_ctx` here is per sequence and the context holds
n_ctx * n_seq_max cells; `max_context` is what llama.cpp reports per sequence. Positions come from
the lengths kept here, and rollback is `llama_memory_seq_rm(seq, n, -1)`, so a sequence's cells are
always positions 0..length-1. A multi-sequence forward is one llama_batch and one llama_decode
(more only past n_batch tokens), so the weights are read once for all sequences. With separate
streams llama.cpp splits a batch into ubatches holding equally many tokens of each sequence: equal
k per sequence is one ubatch, ragged k is several (kv_unified=True would take one ubatch, but every
sequence would then attend over all sequences' cells).

Numerics (measured on smollm2-135m, CPU, without the repacked kernels): with flash attention
(llama.cpp's default, auto = on for the CPU) a token's logits are bit-identical however its sequence
was split into forwards of up to ~48 tokens (on Qwen2.5-1.5B Q4_K_M one 16-token near-tie was seen), so greedy speculative output equals plain decoding; larger batches (a long prefill) take
another kernel path and differ in the low bits. With flash attention off, one-token forwards drift
from batched ones after a few tokens, enough to flip greedy choices.

Candidate trees (`trees=True`): one unified KV stream, each leaf a branch sequence id
(draftwise.backends.llama_trees).
"""
from __future__ import annotations

import ctypes
import os

import llama_cpp as _ll
import numpy as np
import torch

from draftwise.backends.base import (Forward, KVState, Weights, check_forward_args, equal_split_parts, file_identity,
                                     padded_parts)
from draftwise.backends.llama_setup import amx_would_crash, gguf_embedding_tables, init_backend, llama_tokenize
from draftwise.backends.llama_trees import GRAVEYARD, MAX_LEAVES, Tree
from draftwise.machine import physical_cores

class LlamaRunner:
    backend = "llama.cpp"
    saves = True
    returns_features = True  # the last layer's state only
    features_free = False  # they cost work: embeddings in every row of a prefill, a copy per row (docs/heads.md)
    _model = _ctx = _batch = None  # what close() frees, also after a failed __init__

    def __init__(self, model_path: str, n_ctx: int | None = None, n_batch: int = 512, n_seq_max: int = 4,
                 n_threads: int | None = None, n_threads_batch: int | None = None,
                 extra_bufts: bool | None = None, flash_attn: bool | None = None, trees: bool = False):
        if n_seq_max < 1 or n_batch < 1:
            raise ValueError(f"n_seq_max ({n_seq_max}) and n_batch ({n_batch}) must be >= 1")
        if trees and n_seq_max != 1:
            raise ValueError(f"a llama.cpp runner with candidate trees holds one sequence at a time (see the "
                             f"module docstring), got n_seq_max {n_seq_max}: run with --max-running 1")
        self.trees = trees
        self.model_path = str(model_path)
        if not os.path.isfile(self.model_path):
            raise FileNotFoundError(f"GGUF file {self.model_path} does not exist")
        init_backend()
        mp = _ll.llama_model_default_params()
        # Extra buffer types (repacked weights, AMX) are off by default: their multi-token kernels
        # round differently from the one-token ones, so greedy speculative output diverged from plain
        # decoding at near-ties (logit margins 0.01-0.28 on Qwen2.5-1.5B Q4_K_M, docs/results.md);
        # without them that held on SmolLM2 and on 19 of 20 Qwen runs (one near-tie remains with
        # 16-token forwards). They decode ~1.4x faster here: extra_bufts=True trades exactness for
        # speed (never where AMX crashes).
        mp.use_extra_bufts = bool(extra_bufts) and not amx_would_crash()
        self.fast_kernels = bool(mp.use_extra_bufts)
        self._model = _ll.llama_model_load_from_file(self.model_path.encode(), mp)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {self.model_path}: not a GGUF model it can read")
        self._vocab = _ll.llama_model_get_vocab(self._model)
        self.vocab_size = int(_ll.llama_vocab_n_tokens(self._vocab))
        train_ctx = int(_ll.llama_model_n_ctx_train(self._model)) or 4096
        n_ctx = int(n_ctx or min(4096, train_ctx))
        threads = n_threads or physical_cores()

        cp = _ll.llama_context_default_params()
        cp.n_ctx = n_ctx * n_seq_max * (2 if trees else 1)  # split evenly over the streams; trees: see above
        n_ids = 2 + MAX_LEAVES if trees else n_seq_max  # trees: the sequence, its graveyard, the leaves
        cp.n_seq_max = n_ids
        cp.kv_unified = trees  # else per-sequence streams: each one attends over its own cells only
        cp.n_batch = cp.n_ubatch = n_batch  # one logical batch = one physical batch; bigger ones split here
        cp.n_threads, cp.n_threads_batch = threads, n_threads_batch or threads
        if flash_attn is not None:  # None: llama.cpp's auto (on for the CPU), see the docstring
            cp.flash_attn_type = 1 if flash_attn else 0
        self._ctx = _ll.llama_init_from_model(self._model, cp)
        if not self._ctx:
            self.close()
            raise RuntimeError(f"llama.cpp could not create a context of {n_ctx} x {n_seq_max} tokens "
                               f"for {self.model_path}")
        self._mem = _ll.llama_get_memory(self._ctx)
        self.n_seq_max = n_seq_max if trees else int(_ll.llama_n_seq_max(self._ctx))
        self.n_batch = int(_ll.llama_n_batch(self._ctx))
        self.max_context = n_ctx if trees else min(n_ctx, int(_ll.llama_n_ctx_seq(self._ctx)))
        self.n_threads = threads
        self.hidden_size = int(_ll.llama_model_n_embd(self._model))
        self.num_layers = int(_ll.llama_model_n_layer(self._model))
        # features ([] only: the last layer's normed state) are llama.cpp's per-token embeddings,
        # from the same decode as the logits; switched on only for the forwards that return them
        self._embeddings = False

        # One batch, reused: numpy views over its token/pos/logits arrays are filled by slices.
        # llama_batch_init mallocs each token's seq_id list apart, so those are written one by one,
        # and only where the sequence id changed since the last forward.
        self._batch = _ll.llama_batch_init(self.n_batch, 0, n_ids)
        b, n = self._batch, self.n_batch
        self._tok = np.ctypeslib.as_array(b.token, shape=(n,))
        self._pos = np.ctypeslib.as_array(b.pos, shape=(n,))
        self._want = np.ctypeslib.as_array(b.logits, shape=(n,))
        self._n_ids = np.ctypeslib.as_array(b.n_seq_id, shape=(n,))
        self._n_ids[:] = 1
        self._seq_written = np.full(n, -1, dtype=np.int32)  # what each b.seq_id[i][0] holds now

        self._lengths: dict[int, int] = {}  # live sequence id -> tokens in its KV
        self._free_ids = list(range(self.n_seq_max - 1, -1, -1))  # pop() hands out the lowest id
        self._branch_ids = list(range(n_ids - 1, 1, -1))  # trees: ids for the leaves (1: the graveyard)
        self._pending: dict[int, Tree] = {}  # sequence -> the tree its last forward fed
        # the sequence's length at its first tree since the graveyard was emptied: a truncation to
        # at most this frees the graveyard too (its cells all come after the ones kept); a deeper
        # one leaves it, since a rejected branch may sit before a kept cell
        self._dead_from: int | None = None

    # --- sequences -------------------------------------------------------------------------

    def new_sequence(self) -> int:
        if not self._free_ids:
            raise ValueError(f"all {self.n_seq_max} sequences of this llama.cpp context are in use; "
                             "free one, or load with a larger n_seq_max")
        seq = self._free_ids.pop()
        self._lengths[seq] = 0
        return seq

    def length(self, seq_id: int) -> int:
        t = self._pending.get(seq_id)
        return self._lengths[seq_id] + (len(t.parents) if t else 0)

    def truncate(self, seq_id: int, n: int) -> None:
        if seq_id in self._pending:  # after a tree: keep its first n - length fed tokens (a chain)
            self.keep(seq_id, n, [])
            return
        cur = self._lengths[seq_id]
        if not 0 <= n <= cur:
            raise ValueError(f"cannot truncate sequence {seq_id} of {cur} tokens to {n}")
        if n < cur:
            if not _ll.llama_memory_seq_rm(self._mem, seq_id, n, -1):
                raise RuntimeError(f"llama.cpp refused to remove positions {n}.. of sequence {seq_id}")
            if self._dead_from is not None and n <= self._dead_from:  # every rejected branch came after n
                _ll.llama_memory_seq_rm(self._mem, GRAVEYARD, -1, -1)
                self._dead_from = None
            self._lengths[seq_id] = n

    def keep(self, seq_id: int, n: int, rows: list[int]) -> None:
        """After a tree forward: keep the first n tokens and the fed tokens at `rows`, which must
        extend them along one root-to-node path of the tree."""
        t = self._pending.get(seq_id)
        start = self._lengths[seq_id]
        if t is None:
            if rows != list(range(n, n + len(rows))):
                raise ValueError(f"sequence {seq_id} holds a chain: keep rows {rows} after {n} tokens is not one")
            self.truncate(seq_id, n + len(rows))
            return
        kept = list(range(n - start)) + [r - start for r in rows]  # indices into the fed tokens
        if n < start:
            kept = []
        ok = all(0 <= j < len(t.parents) for j in kept) and all(
            t.parents[j] == (kept[i - 1] if i else -1) for i, j in enumerate(kept))
        if not ok:
            raise ValueError(f"cannot keep {n} tokens and rows {rows} of sequence {seq_id}: not a path of its tree")
        if self._dead_from is None:
            self._dead_from = start
        if kept:  # the accepted path's cells, from a branch below its last node, join the sequence
            branch = t.leaf_ids[t.below[kept[-1]][0]]
            _ll.llama_memory_seq_cp(self._mem, branch, seq_id, start, start + len(kept))
        self._drop_tree(seq_id)
        self._lengths[seq_id] = start + len(kept)
        if n < start:
            self.truncate(seq_id, n)

    def _drop_tree(self, seq_id: int) -> None:
        """The branches' cells go to the graveyard (never a hole before the sequence's next cells)."""
        t = self._pending.pop(seq_id, None)
        if t is None:
            return
        for b in t.leaf_ids.values():
            _ll.llama_memory_seq_cp(self._mem, b, GRAVEYARD, -1, -1)
            _ll.llama_memory_seq_rm(self._mem, b, -1, -1)
            self._branch_ids.append(b)

    def free(self, seq_id: int) -> None:
        self._drop_tree(seq_id)
        if self._lengths.pop(seq_id, None) is None:
            return
        if self._ctx:
            _ll.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
            if self.trees:
                _ll.llama_memory_seq_rm(self._mem, GRAVEYARD, -1, -1)
                self._dead_from = None
        self._free_ids.append(seq_id)
        self._free_ids.sort(reverse=True)

    # --- forward ---------------------------------------------------------------------------

    def _set_embeddings(self, on: bool) -> None:
        if on != self._embeddings:
            _ll.llama_set_embeddings(self._ctx, on)
            self._embeddings = on

    def forward_parts(self, ks: list[int]) -> list[tuple[int, int]]:
        """Separate streams: ubatches of equally many tokens per sequence (split_equal; past
        n_batch tokens more splits follow, and a decoding step stays far below it). Unified (trees):
        one ubatch of every token, priced as padded."""
        return padded_parts(ks) if self.trees else equal_split_parts(ks)

    def forward(self, seq_ids: list[int], tokens: list[list[int]], num_logits: list[int],
                parents: list[list[int] | None] | None = None) -> list[torch.Tensor]:
        return self._run(seq_ids, tokens, num_logits, parents, False).logits

    def forward_features(self, seq_ids: list[int], tokens: list[list[int]], num_logits: list[int],
                         layers: list[int], parents: list[list[int] | None] | None = None) -> Forward:
        """forward, and the features of the rows that get logits ([k, H] per sequence)."""
        if layers:
            raise ValueError(f"llama.cpp returns only the last layer's state, not layers {layers}")
        return self._run(seq_ids, tokens, num_logits, parents, True)

    def _run(self, seq_ids: list[int], tokens: list[list[int]], num_logits: list[int],
             parents: list[list[int] | None] | None, features: bool) -> Forward:
        check_forward_args(seq_ids, tokens, num_logits)
        if parents and any(parents) and not self.trees:
            raise ValueError("this llama.cpp runner verifies chains only: load it with trees=True for candidate trees")
        if parents and any(parents) and features:
            raise ValueError("candidate trees and target features (a draft head) do not go together")
        if self._ctx is None:
            raise RuntimeError("this LlamaRunner is closed")
        self._set_embeddings(features)
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"a sequence may appear only once in a forward, got {seq_ids}")
        starts = []
        for seq, toks in zip(seq_ids, tokens):
            if seq not in self._lengths:
                raise ValueError(f"sequence {seq} is not in use (new_sequence() first)")
            start = self._lengths[seq]
            if start + len(toks) > self.max_context:
                raise ValueError(f"sequence {seq} holds {start} tokens; {len(toks)} more would exceed "
                                 f"the context of {self.max_context} tokens per sequence")
            if seq in self._pending:
                raise ValueError(f"sequence {seq} holds an unverified tree: keep() or truncate() it first")
            starts.append(start)

        # the batch: each sequence's new tokens in turn, logits only for its last k
        counts = np.array([len(t) for t in tokens])
        total = int(counts.sum())
        tok = np.fromiter((t for toks in tokens for t in toks), dtype=np.int32, count=total)
        offsets = np.cumsum(counts) - counts
        pos = np.arange(total) - np.repeat(offsets - np.array(starts), counts)
        seq = np.repeat(np.asarray(seq_ids, dtype=np.int32), counts)
        want = np.zeros(total, dtype=np.int8)
        for off, n, k in zip(offsets, counts, num_logits):
            want[off + n - k: off + n] = 1
        ids: dict[int, list[int]] = {}  # batch index -> every sequence id of a tree's token
        trees = {s: Tree.of(p) for s, p in zip(seq_ids, parents or []) if p}
        for i, (s, t) in enumerate(trees.items()):
            off, start = int(offsets[seq_ids.index(s)]), starts[seq_ids.index(s)]
            t.assign(self._branch_ids, self._mem, s)
            self._pending[s] = t
            pos[off: off + len(t.parents)] = start + np.array(t.depth)
            for j, leaves in enumerate(t.below):
                ids[off + j] = [t.leaf_ids[x] for x in leaves]

        rows, feats = [], []  # [n_out, V] and [n_out, H] per decode, copied: llama.cpp reuses its buffers
        try:
            for lo in range(0, total, self.n_batch):
                hi = min(lo + self.n_batch, total)
                self._decode(tok[lo:hi], pos[lo:hi], seq[lo:hi], want[lo:hi],
                             {i - lo: v for i, v in ids.items() if lo <= i < hi})
                if want[lo:hi].any():
                    rows.append(self._read_logits(want[lo:hi]))
                    if features:
                        feats.append(self._read_rows(_ll.llama_get_embeddings_ith, want[lo:hi], self.hidden_size))
        except BaseException:
            for s, start in zip(seq_ids, starts):  # a failed or split decode may leave cells behind
                self._drop_tree(s)
                _ll.llama_memory_seq_rm(self._mem, s, start, -1)
            raise
        for s, n in zip(seq_ids, counts):
            if s not in trees:  # a tree's tokens join the sequence at keep()
                self._lengths[s] += int(n)

        logits = torch.from_numpy(rows[0] if len(rows) == 1 else np.concatenate(rows)) if rows \
            else torch.empty(0, self.vocab_size)
        out, r = [], 0
        for k in num_logits:
            out.append(logits[r: r + k])  # [k, V]
            r += k
        if not features:
            return Forward(out, [])
        f = torch.from_numpy(np.concatenate(feats)) if feats else torch.empty(0, self.hidden_size)
        ends = np.cumsum(num_logits)
        return Forward(out, [f[e - k: e] for e, k in zip(ends, num_logits)])  # [k, H] each

    def _decode(self, tok: np.ndarray, pos: np.ndarray, seq: np.ndarray, want: np.ndarray,
                ids: dict[int, list[int]] | None = None) -> None:
        n = len(tok)
        self._tok[:n], self._pos[:n], self._want[:n] = tok, pos, want
        for i in np.flatnonzero(self._seq_written[:n] != seq):
            self._batch.seq_id[i][0] = int(seq[i])
            self._seq_written[i] = seq[i]
            self._n_ids[i] = 1
        for i, v in (ids or {}).items():  # a tree's token: its leaves' branch ids
            for k, s in enumerate(v):
                self._batch.seq_id[i][k] = s
            self._n_ids[i] = len(v)
            self._seq_written[i] = -1  # rewritten by the next forward
        self._batch.n_tokens = n
        rc = _ll.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} on a batch of {n} tokens "
                               "(1: no KV slot, -1: invalid batch, 2: aborted, < -1: fatal)")

    def _read_logits(self, want: np.ndarray) -> np.ndarray:  # -> [n_out, V] float32
        return self._read_rows(_ll.llama_get_logits_ith, want, self.vocab_size)

    def _read_rows(self, get, want: np.ndarray, width: int) -> np.ndarray:  # -> [n_out, width] float32
        idx = np.flatnonzero(want)
        first = get(self._ctx, int(idx[0]))
        last = get(self._ctx, int(idx[-1]))
        if not first or not last:
            raise RuntimeError("llama.cpp returned no output rows for a requested position")
        a0 = ctypes.cast(first, ctypes.c_void_p).value
        a1 = ctypes.cast(last, ctypes.c_void_p).value
        if a1 - a0 == (len(idx) - 1) * width * 4:  # outputs stored in batch order: one block
            return np.ctypeslib.as_array(first, shape=(len(idx), width)).copy()
        return np.stack([np.ctypeslib.as_array(get(self._ctx, int(i)), shape=(width,))
                         for i in idx])  # np.stack copies

    def embedding_tables(self):
        """(input embedding [V, H], rows(ids) -> the LM head's rows [len(ids), H]) as float32."""
        return gguf_embedding_tables(self.model_path, self.vocab_size)

    # --- extras ----------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """llama.cpp's own tokenizer (the engine uses the transformers one; tests compare the two)."""
        return llama_tokenize(self._vocab, text, add_special, parse_special)

    def identity(self) -> dict:
        return file_identity(self.model_path, n_threads=self.n_threads, n_batch=self.n_batch,
                             fast_kernels=self.fast_kernels)

    def weights(self) -> Weights:
        return Weights(os.path.getsize(self.model_path), f"gguf:{os.path.basename(self.model_path)}",
                       "repacked" if self.fast_kernels else "standard")

    def kv_bytes(self) -> int:
        """Bytes of KV state held by live sequences (llama.cpp's per-sequence state size: the K and V
        rows of its cells plus a few bytes of metadata); the preallocated buffer is larger."""
        if self._ctx is None:
            return 0
        ids = list(self._lengths) + ([GRAVEYARD] if self.trees else [])
        return sum(int(_ll.llama_state_seq_get_size(self._ctx, s)) for s in ids)

    def save(self, seq_id: int) -> KVState:
        """A copy of the sequence's cells in host memory (llama.cpp's sequence state)."""
        if self._lengths.get(seq_id) is None or seq_id in self._pending:
            raise ValueError(f"sequence {seq_id} is not a live sequence without a pending tree")
        size = int(_ll.llama_state_seq_get_size(self._ctx, seq_id))
        buf = (ctypes.c_uint8 * size)()
        if int(_ll.llama_state_seq_get_data(self._ctx, buf, size, seq_id)) != size:
            raise RuntimeError(f"llama.cpp could not copy sequence {seq_id}'s state ({size} bytes)")
        return KVState(self._lengths[seq_id], size, buf)

    def restore(self, seq_id: int, state: KVState) -> None:
        """Give an empty sequence a saved state: its cells take the stream's first free ones, in
        order, so the sequence has no holes (the module docstring)."""
        if self._lengths.get(seq_id) != 0:
            raise ValueError(f"restore needs an empty live sequence, sequence {seq_id} holds {self._lengths.get(seq_id)}")
        if int(_ll.llama_state_seq_set_data(self._ctx, state.data, state.nbytes, seq_id)) != state.nbytes:
            _ll.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
            raise RuntimeError(f"llama.cpp could not restore a saved state of {state.n} tokens into sequence {seq_id}")
        self._lengths[seq_id] = state.n

    def close(self) -> None:
        if self._batch is not None:
            _ll.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            _ll.llama_free(self._ctx)
        self._ctx = None
        if self._model:
            _ll.llama_model_free(self._model)
        self._model = None
        self._lengths = {}

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown may have torn down ctypes or the module already
            pass

