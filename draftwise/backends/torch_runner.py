"""PyTorch + transformers backend: any AutoModelForCausalLM, fp32 on CPU (or a GPU).

KV scheme: one transformers `DynamicCache` per sequence. `DynamicCache.crop` cuts every batch row
by the same amount, so a batched cache cannot roll back ragged sequences; per-sequence caches
make `truncate(seq, n)` an independent `crop(n)`. A candidate tree is fed with a 4-D attention
mask (each new token sees the cached tokens and its ancestors) and explicit positions; `keep`
gathers the accepted path's cells. A multi-sequence `forward` runs the sequences
one after another (no padding, no wasted compute); batching them into one kernel call is the
llama.cpp backend's job, where sequence ids share one KV buffer.
"""
from __future__ import annotations

import copy
import itertools

import torch
from transformers import DynamicCache

from draftwise.backends import packed_linear
from draftwise.backends.base import Forward, KVState, Weights, check_forward_args, torch_weights, tree_layout
from draftwise.machine import cache_dir


class TorchRunner:
    backend = "torch"
    n_seq_max = None  # sequences are unbounded
    saves = True
    returns_features = True
    features_free = True  # the hidden states come with the forward, for every new token

    def __init__(self, model, max_context: int | None = None, device: str | torch.device = "cpu",
                 pack: str | None = None):
        """pack: "off", "hybrid", "full" or "onednn" — fp32 linears on MKL's packed GEMM or oneDNN
        (packed_linear.py); None = DRAFTWISE_TORCH_PACK or a measured choice, "single" the choice
        for a model stepped one token at a time; for fp32 on a CPU only."""
        self.model = model.eval().to(device)
        self.device = torch.device(device)
        cfg = model.config
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.num_params = sum(p.numel() for p in model.parameters())
        cpu_fp32 = self.device.type == "cpu" and next(model.parameters()).dtype == torch.float32
        mode = packed_linear.choose_mode(self.model, pack) if cpu_fp32 else "off"
        self.packed = mode if packed_linear.pack_linears(self.model, mode) > 0 else "off"
        self.pad = packed_linear.choose_pad(self.model, cache_dir() / "kernels") if self.packed == "onednn" else ()
        packed_linear.set_pad(self.model, self.pad)
        self.max_context = int(max_context or getattr(cfg, "max_position_embeddings", 4096))
        self.hidden_size = int(cfg.hidden_size)
        self.num_layers = int(cfg.num_hidden_layers)
        self._caches: dict[int, DynamicCache] = {}
        self._ids = itertools.count()
        # trees need every layer's cache to be a plain list of cells (no sliding window, no indexer)
        self.trees = all(type(layer).__name__ == "DynamicLayer" for layer in DynamicCache(config=cfg).layers)

    def new_sequence(self) -> int:
        seq = next(self._ids)
        self._caches[seq] = DynamicCache(config=self.model.config)
        return seq

    @staticmethod
    def forward_parts(ks: list[int]) -> list[tuple[int, int]]:
        """Sequences run one after another: one forward of k tokens each."""
        return [(k, 1) for k in ks]

    def forward(self, seq_ids: list[int], tokens: list[list[int]], num_logits: list[int],
                parents: list[list[int] | None] | None = None) -> list[torch.Tensor]:
        return self._run(seq_ids, tokens, num_logits, parents, None).logits

    def forward_features(self, seq_ids: list[int], tokens: list[list[int]], num_logits: list[int],
                         layers: list[int], parents: list[list[int] | None] | None = None) -> Forward:
        """forward, and the features of every new token ([n, F] per sequence)."""
        return self._run(seq_ids, tokens, num_logits, parents, layers)

    @torch.inference_mode()
    def _run(self, seq_ids: list[int], tokens: list[list[int]], num_logits: list[int],
             parents: list[list[int] | None] | None, layers: list[int] | None) -> Forward:
        check_forward_args(seq_ids, tokens, num_logits)
        out, feats = [], []
        want = layers is not None
        for i, (seq, toks, k) in enumerate(zip(seq_ids, tokens, num_logits)):
            cache = self._caches[seq]
            if cache.get_seq_length() + len(toks) > self.max_context:
                raise ValueError(f"sequence {seq} would exceed the context of {self.max_context} tokens")
            ids = torch.tensor([toks], dtype=torch.long, device=self.device)  # [1, n]
            tree = self._tree_inputs(cache.get_seq_length(), parents[i]) if parents and parents[i] else {}
            res = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=max(k, 1),
                             output_hidden_states=want, **tree)
            logits = res.logits[0, -k:] if k else res.logits[0, :0]  # [k, V]
            out.append(logits.float().cpu())  # verification runs on the host, for either device
            if want:
                hs = res.hidden_states  # [embeddings, input of layer 1, ..., the last layer's normed output]
                f = torch.cat([hs[i] for i in layers], -1) if layers else hs[-1]  # [1, n, F]
                feats.append(f[0].float().cpu())  # [n, F]
        return Forward(out, feats)

    def _tree_inputs(self, past: int, parents: list[int]) -> dict:
        """attention_mask [1, 1, n, past + n] (True: attend) and position_ids [1, n] for a tree."""
        if not self.trees:
            raise ValueError(f"{type(self.model).__name__}'s cache layers cannot hold a candidate tree")
        depth, sees = tree_layout(parents)
        n = len(parents)
        mask = torch.zeros(1, 1, n, past + n, dtype=torch.bool, device=self.device)
        mask[..., :past] = True
        for j, cols in enumerate(sees):
            mask[0, 0, j, [past + c for c in cols]] = True
        pos = torch.tensor([[past + d for d in depth]], dtype=torch.long, device=self.device)
        return {"attention_mask": mask, "position_ids": pos}

    def keep(self, seq_id: int, n: int, rows: list[int]) -> None:
        cache = self._caches[seq_id]
        length = cache.get_seq_length()
        if not (0 <= n <= length and all(n <= r < length for r in rows) and rows == sorted(set(rows))):
            raise ValueError(f"cannot keep {n} tokens and rows {rows} of sequence {seq_id} ({length} tokens)")
        idx = torch.tensor(list(range(n)) + rows, dtype=torch.long, device=self.device)
        for layer in cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(-2, idx)
                layer.values = layer.values.index_select(-2, idx)

    def embedding_tables(self):
        """(input embedding [V, H], rows(ids) -> the LM head's rows [len(ids), H]) as float32."""
        emb = self.model.get_input_embeddings().weight.detach().float().cpu()
        head = self.model.get_output_embeddings()
        if getattr(head, "weight", None) is not None:
            lm = head.weight.detach()
        else:  # packed (packed_linear keeps only its own layout): a bias-free linear of I is W.T
            with torch.inference_mode():
                lm = head(torch.eye(head.in_features, device=self.device)).T  # [V, H]
        return emb, lambda ids: lm[ids.to(lm.device)].float().cpu()

    def truncate(self, seq_id: int, n: int) -> None:
        cache = self._caches[seq_id]
        if not 0 <= n <= cache.get_seq_length():
            raise ValueError(f"cannot truncate sequence {seq_id} of {cache.get_seq_length()} tokens to {n}")
        if n < cache.get_seq_length():
            cache.crop(n - cache.get_seq_length())  # transformers 5.x: a negative count removes tokens

    def length(self, seq_id: int) -> int:
        return self._caches[seq_id].get_seq_length()

    def free(self, seq_id: int) -> None:
        self._caches.pop(seq_id, None)

    def save(self, seq_id: int) -> KVState:
        """A copy of the sequence's cache (on the KV's device). Its tensors may be views of longer
        ones (`crop` slices), so each is copied compactly rather than with its whole storage."""
        src = self._caches[seq_id]
        cache = copy.deepcopy(src, {id(t): t.clone(memory_format=torch.contiguous_format) for t in _kv_tensors(src)})
        return KVState(cache.get_seq_length(), _cache_bytes(cache), cache)

    def restore(self, seq_id: int, state: KVState) -> None:
        if self.length(seq_id):
            raise ValueError(f"sequence {seq_id} holds {self.length(seq_id)} tokens: restore needs an empty one")
        self._caches[seq_id] = copy.deepcopy(state.data)

    def kv_bytes(self) -> int:
        return sum(_cache_bytes(c) for c in self._caches.values())

    def weights(self) -> Weights:
        """Its parameters; kernels: packed_linear's mode, and how oneDNN pads short calls."""
        kernels = None if self.packed == "off" else self.packed + (f", pad {list(self.pad)}" if self.pad else "")
        return torch_weights(self.model, kernels)

    def identity(self) -> dict | None:
        """The model by name (a directory can hold several GGUF files: its size tells them apart)
        and the settings; None for a model loaded without a name."""
        name = self.model.config._name_or_path
        if not name:
            return None
        return {"model": name, "device": str(self.device), "threads": torch.get_num_threads(),
                "dtype": str(next(self.model.parameters()).dtype), "params": self.num_params,
                "packed": self.packed, **({"pad": list(self.pad)} if self.pad else {})}


def _kv_tensors(cache: DynamicCache):
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                yield t


def _cache_bytes(cache: DynamicCache) -> int:
    return sum(t.numel() * t.element_size() for t in _kv_tensors(cache))
