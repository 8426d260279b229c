"""ONNX Runtime GenAI backend: a model built by the runtime's builder (int4 MatMulNBits on the CPU).

KV scheme: one `og.Generator` per sequence (batch size 1), each the owner of its sequence's KV
buffer: the runtime rewinds only a batch of one (`rewind_to` refuses a length other than 0 for
batch > 1, and its batched `append_tokens` runs once per generator), so a multi-sequence forward runs
the sequences one after another, as the torch backend does. `forward` is `append_tokens` of the new
tokens (the runtime's continuous decoding) and reads the model's raw `logits` output, which holds
every fed position's row ([1, n, V]); `truncate(seq, n)` is `rewind_to(n)`, exact: with the builder's
past-present shared buffer the cells past n are only overwritten by the next forward. A freed
sequence's generator is rewound to 0 and kept for the next sequence (its KV buffer of max_context
tokens is allocated once).

Kernels (int4 MatMulNBits, accuracy level 4: activations quantised to int8): a forward of one token
takes another kernel path than a forward of several, and its logits differ by up to ~1 (smollm2-135m),
enough to flip a greedy near-tie between plain decoding and verification. A forward of two or more
tokens computes each row alike whatever the rows beside it (bitwise, tests/test_ort_backend.py), so
with `pad` (default) a one-token forward runs as two (the token twice, the second cell rewound at
once): every forward takes the multi-token path, and speculative greedy output is plain greedy output
token for token, for the price of a two-token forward per plain step.

Not offered: candidate trees (the builder's GroupQueryAttention masks causally from each sequence's
length, with no input for an arbitrary mask: chains only), prompt caching (no call copies a
generator's KV state out or back), target features for a head (the model as built outputs logits
only). A prompt is fed in chunks of `chunk` tokens: the model computes logits at every fed position,
and a 4,096-token feed would return a [4096, 151936] float32 tensor (2.5 GB).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import torch

from draftwise.backends.base import Weights, check_forward_args, file_identity
from draftwise.machine import physical_cores

CONFIG = "genai_config.json"


class OrtRunner:
    backend = "onnx"
    n_seq_max = None  # one generator per sequence: unbounded
    trees = False  # GroupQueryAttention takes no attention mask for a tree (module docstring)
    saves = False  # no call copies a generator's KV out: no prompt cache
    returns_features = False  # the model as built outputs logits only
    features_free = False

    def __init__(self, model_dir: str | Path, max_context: int | None = None, n_threads: int | None = None,
                 chunk: int = 256, pad: bool = True):
        self.model_dir = Path(model_dir)
        if not (self.model_dir / CONFIG).is_file():
            raise FileNotFoundError(f"{self.model_dir} holds no {CONFIG}: not an onnxruntime-genai model directory "
                                    "(draftwise.models.ort_convert converts one)")
        cfg = json.loads((self.model_dir / CONFIG).read_text())["model"]
        self.vocab_size = int(cfg["vocab_size"])
        self.max_context = int(min(max_context or 4096, cfg.get("context_length") or 4096))
        self.model_path = str(self.model_dir / cfg["decoder"]["filename"])  # the profile cache's key
        self.n_threads = int(n_threads or physical_cores())
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1 token, got {chunk}")
        self.chunk = chunk
        self.pad = pad
        dec = cfg["decoder"]
        self._kv_per_token = 2 * int(dec["num_hidden_layers"]) * int(dec["num_key_value_heads"]) * int(dec["head_size"]) * 4
        config = og.Config(str(self.model_dir))
        config.clear_providers()  # the CPU
        config.overlay(json.dumps({"model": {"decoder": {"session_options": {
            "intra_op_num_threads": self.n_threads, "inter_op_num_threads": 1}}}}))
        self._model = og.Model(config)
        self._gens: dict[int, og.Generator] = {}
        self._lengths: dict[int, int] = {}
        self._spare: list[og.Generator] = []  # rewound to 0, for the next sequence
        self._next_id = 0

    # --- sequences -------------------------------------------------------------------------

    def new_sequence(self) -> int:
        if self._spare:
            gen = self._spare.pop()
        else:
            params = og.GeneratorParams(self._model)
            params.set_search_options(max_length=self.max_context, batch_size=1)
            gen = og.Generator(self._model, params)
        seq, self._next_id = self._next_id, self._next_id + 1
        self._gens[seq], self._lengths[seq] = gen, 0
        return seq

    def length(self, seq_id: int) -> int:
        return self._lengths[seq_id]

    def truncate(self, seq_id: int, n: int) -> None:
        cur = self._lengths[seq_id]
        if not 0 <= n <= cur:
            raise ValueError(f"cannot truncate sequence {seq_id} of {cur} tokens to {n}")
        if n < cur:
            self._gens[seq_id].rewind_to(n)
            self._lengths[seq_id] = n

    def keep(self, seq_id: int, n: int, rows: list[int]) -> None:
        if rows != list(range(n, n + len(rows))):
            raise ValueError("the onnx backend verifies chains only: keep() takes the rows right after n")
        self.truncate(seq_id, n + len(rows))

    def free(self, seq_id: int) -> None:
        gen = self._gens.pop(seq_id, None)
        self._lengths.pop(seq_id, None)
        if gen is not None:
            gen.rewind_to(0)
            self._spare.append(gen)

    def identity(self) -> dict:
        return file_identity(self.model_path, n_threads=self.n_threads, n_batch=None, fast_kernels=None)

    def weights(self) -> Weights:
        """The model directory's ONNX files (the graph and its external data)."""
        files = [f for f in self.model_dir.iterdir() if f.name.startswith(Path(self.model_path).name)]
        return Weights(sum(f.stat().st_size for f in files), f"onnx:{self.model_dir.name}")

    def kv_bytes(self) -> int:
        """Bytes of the KV rows the live sequences hold (each generator's buffer is max_context long)."""
        return sum(self._lengths.values()) * self._kv_per_token

    # --- forward ---------------------------------------------------------------------------

    @staticmethod
    def forward_parts(ks: list[int]) -> list[tuple[int, int]]:
        """Sequences run one after another: one forward of k tokens each."""
        return [(k, 1) for k in ks]

    def forward(self, seq_ids: list[int], tokens: list[list[int]], num_logits: list[int],
                parents: list[list[int] | None] | None = None) -> list[torch.Tensor]:
        check_forward_args(seq_ids, tokens, num_logits)
        if parents and any(parents):
            raise ValueError("the onnx backend verifies chains only (module docstring): no candidate trees")
        if len(set(seq_ids)) != len(seq_ids):
            raise ValueError(f"a sequence may appear only once in a forward, got {seq_ids}")
        for seq, toks in zip(seq_ids, tokens):
            if seq not in self._gens:
                raise ValueError(f"sequence {seq} is not in use (new_sequence() first)")
            if self._lengths[seq] + len(toks) > self.max_context:
                raise ValueError(f"sequence {seq} holds {self._lengths[seq]} tokens; {len(toks)} more would exceed "
                                 f"the context of {self.max_context} tokens per sequence")
        return [self._feed(seq, toks, k) for seq, toks, k in zip(seq_ids, tokens, num_logits)]

    def _feed(self, seq: int, toks: list[int], k: int) -> torch.Tensor:  # -> [k, V] float32
        gen, start, rows = self._gens[seq], self._lengths[seq], []
        try:
            if len(toks) == 1 and self.pad and start + 2 <= self.max_context:  # the multi-token path (docstring)
                gen.append_tokens(np.asarray(toks * 2, dtype=np.int32))
                self._lengths[seq] = start + 2
                if k:
                    rows.append(np.asarray(gen.get_output("logits")[0, :1], dtype=np.float32))
                gen.rewind_to(start + 1)
                self._lengths[seq] = start + 1
                toks = []
            for lo in range(0, len(toks), self.chunk):
                part = toks[lo: lo + self.chunk]
                gen.append_tokens(np.asarray(part, dtype=np.int32))
                self._lengths[seq] += len(part)
                want = k - (len(toks) - lo - len(part))  # of this chunk's rows, how many end in the last k
                if want > 0:
                    out = gen.get_output("logits")  # [1, len(part), V], a copy
                    rows.append(np.asarray(out[0, -min(want, len(part)):], dtype=np.float32))
        except BaseException:
            if self._lengths[seq] > start:  # a failed feed leaves the sequence as it was
                gen.rewind_to(start)
                self._lengths[seq] = start
            raise
        if not rows:
            return torch.empty(0, self.vocab_size)
        return torch.from_numpy(rows[0] if len(rows) == 1 else np.concatenate(rows))

    def close(self) -> None:
        self._gens, self._lengths, self._spare = {}, {}, []
        self._model = None
