"""A draft head on the target's own features, in EAGLE-3's layout, and its checkpoints.

One decoder layer reads, at each position j, the embedding of token x_j and a feature of the
position before it, and predicts x_{j+1}:

    hid  = fc(target feature of j-1)            (or the head's own output at j-1 while drafting)
    x    = [input_layernorm(embed(x_j)), hidden_norm(hid)]                       # [T, 2H]
    h    = hid + o_proj(attention(q_proj(x), k_proj(x), v_proj(x)))             # RoPE, causal
    out  = h + mlp(post_attention_layernorm(h))           # the next position's `hid` when drafting
    logits over the draft vocabulary = lm_head(norm(out)); draft id i is target id i + d2t[i]

The target's feature is what draftwise's runners return with their logits (`forward_features`): the
last layer's normed state (llama.cpp and torch), or on torch the concatenated inputs of chosen
layers (EAGLE-3's low / middle / high). A checkpoint is a directory with `config.json` and
`model.safetensors`: tensors `fc.weight`, `midlayer.*`, `norm.weight`, `d2t`, and `lm_head.weight`
and `embed_tokens.weight` where the head has its own (draftwise's heads use the target's embedding
and the target's LM head rows of the draft vocabulary, so a head is small). Checkpoints trained
for vLLM / SGLang (`LlamaForCausalLMEagle3`) load as they are.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CONFIG, WEIGHTS = "config.json", "model.safetensors"


class HeadMismatch(ValueError):
    """The head was made for another target (hidden size, vocabulary or feature layers)."""


@dataclass(slots=True)
class HeadConfig:
    hidden_size: int  # the target's hidden size H
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    feature_layers: list[int] = field(default_factory=list)  # [] = the last layer's normed state
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    target: str = ""  # what it was trained for (informational)

    @property
    def feature_size(self) -> int:
        return self.hidden_size * max(1, len(self.feature_layers))

    def to_json(self) -> dict:
        """config.json: EAGLE-3's keys (vLLM / SGLang read them) plus draftwise's own section."""
        return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                "hidden_size": self.hidden_size, "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
                "intermediate_size": self.intermediate_size, "vocab_size": self.vocab_size,
                "draft_vocab_size": self.draft_vocab_size, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "num_hidden_layers": 1, "hidden_act": "silu",
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": self.feature_layers},
                "draftwise": asdict(self)}

    @classmethod
    def from_json(cls, d: dict, target_layers: int | None = None) -> HeadConfig:
        if "draftwise" in d:
            return cls(**d["draftwise"])
        if "LlamaForCausalLMEagle3" not in d.get("architectures", []):
            raise ValueError(f"not a draft head: architectures {d.get('architectures')} "
                             "(expected LlamaForCausalLMEagle3 or a draftwise head)")
        layers = (d.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if not layers:
            if target_layers is None:
                raise ValueError("this EAGLE-3 head names no feature layers and the target's layer count is unknown")
            layers = [2, target_layers // 2, target_layers - 3]  # vLLM's default
        nh = d["num_attention_heads"]
        return cls(d["hidden_size"], nh, d.get("num_key_value_heads", nh), d.get("head_dim") or d["hidden_size"] // nh,
                   d["intermediate_size"], d["vocab_size"], d.get("draft_vocab_size") or d["vocab_size"],
                   list(layers), d.get("rms_norm_eps", 1e-6), d.get("rope_theta", 10000.0))


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(n)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class _Attention(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)


class _MLP(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, c: HeadConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = _Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = _MLP(c)


class DraftHead(nn.Module):
    """The head's weights and its forward. `embed` [V, H] and, when the head has no LM head of
    its own, `lm_head` [draft_vocab, H] (the target's rows of the draft vocabulary) are frozen
    buffers taken from the target and not saved with the head."""

    def __init__(self, c: HeadConfig, embed: torch.Tensor, lm_head: torch.Tensor | None = None,
                 d2t: torch.Tensor | None = None):
        super().__init__()
        self.config = c
        self.fc = nn.Linear(c.feature_size, c.hidden_size, bias=False)
        self.midlayer = _Layer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.register_buffer("embed", embed, persistent=False)  # [V, H]
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long) if d2t is None else d2t)
        self.own_lm_head = lm_head is None
        if lm_head is None:
            self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        else:
            self.register_buffer("lm_head_rows", lm_head, persistent=False)  # [dv, H]
        inv = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    @property
    def draft_to_target(self) -> torch.Tensor:  # [dv] target token id of each draft id
        return torch.arange(self.config.draft_vocab_size, device=self.d2t.device) + self.d2t

    def layer(self, tok: torch.Tensor, hid: torch.Tensor, pos: torch.Tensor, past=None, mask=None):
        """tok: [B, T] token ids; hid: [B, T, H] (fc already applied to target features); pos: [T]
        RoPE positions; past: (k, v) [B, nkv, P, hd] keys and values before these; mask: [T, P+T]
        bool (True: attend), None = causal over the new tokens after all of past.
        -> (out [B, T, H]: each position's state before the final norm, (k, v) with these added)"""
        c, m = self.config, self.midlayer
        B, T, _ = hid.shape
        x = torch.cat([m.input_layernorm(self.embed[tok].to(hid.dtype)), m.hidden_norm(hid)], -1)  # [B, T, 2H]
        a = m.self_attn
        q = a.q_proj(x).view(B, T, c.num_heads, c.head_dim).transpose(1, 2)  # [B, nh, T, hd]
        k = a.k_proj(x).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)  # [B, nkv, T, hd]
        v = a.v_proj(x).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        cos, sin = self._rope(pos, hid.dtype)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        rep = c.num_heads // c.num_kv_heads
        kk, vv = (k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)) if rep > 1 else (k, v)
        if mask is None and past is not None and T > 1:
            P = past[0].shape[2]
            mask = torch.ones(T, P + T, dtype=torch.bool, device=hid.device).tril(P)
        o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=mask is None and past is None and T > 1)
        h = hid + a.o_proj(o.transpose(1, 2).reshape(B, T, c.num_heads * c.head_dim))
        out = h + m.mlp(m.post_attention_layernorm(h))
        return out, (k, v)

    def logits(self, out: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., draft_vocab]
        x = self.norm(out)
        return self.lm_head(x) if self.own_lm_head else x @ self.lm_head_rows.T.to(x.dtype)

    def target_logits(self, feats: torch.Tensor) -> torch.Tensor:  # [..., H] target features -> [..., draft_vocab]
        """The target's own logits over the draft vocabulary (its LM head rows on its normed state)."""
        return feats @ self.lm_head_rows.T.to(feats.dtype)

    def _rope(self, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        f = pos.float()[:, None] * self.inv_freq[None]  # [T, hd/2]
        e = torch.cat([f, f], -1)
        return e.cos().to(dtype), e.sin().to(dtype)

    def weights(self) -> dict[str, torch.Tensor]:
        """The tensors a checkpoint holds (EAGLE-3 names)."""
        return {k: v for k, v in self.state_dict().items() if k not in ("embed", "lm_head_rows", "inv_freq")}


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin


def new_head(c: HeadConfig, embed: torch.Tensor, lm_head: torch.Tensor, d2t: torch.Tensor, seed: int = 0) -> DraftHead:
    """A freshly initialised head (train-head), on the target's embedding and LM head rows."""
    torch.manual_seed(seed)
    head = DraftHead(c, embed, lm_head, d2t)
    for mod in head.modules():
        if isinstance(mod, nn.Linear):
            nn.init.normal_(mod.weight, std=1.0 / math.sqrt(mod.weight.shape[1]))
    nn.init.normal_(head.midlayer.self_attn.o_proj.weight, std=0.02 / math.sqrt(head.config.hidden_size))
    nn.init.normal_(head.midlayer.mlp.down_proj.weight, std=0.02 / math.sqrt(head.config.intermediate_size))
    return head


def save_head(head: DraftHead, path: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    w = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in head.weights().items()}
    save_file(w, str(path / WEIGHTS))
    (path / CONFIG).write_text(json.dumps(head.config.to_json(), indent=1) + "\n")
    return path


def read_config(path: str | Path, target_layers: int | None = None) -> HeadConfig:
    path = Path(path)
    if not (path / CONFIG).is_file() or not (path / WEIGHTS).is_file():
        raise FileNotFoundError(f"a draft head is a directory with {CONFIG} and {WEIGHTS}; {path} has not both")
    return HeadConfig.from_json(json.loads((path / CONFIG).read_text()), target_layers)


def load_head(path: str | Path, target, dtype: torch.dtype = torch.float32) -> DraftHead:
    """The head in `path` for the target runner (whose `hidden_size`, `vocab_size`, `num_layers`
    and `embedding_tables()` it reads). Refuses a head made for another target, naming both."""
    from safetensors.torch import load_file

    path = Path(path)
    c = read_config(path, target.num_layers)
    H, V = target.hidden_size, target.vocab_size
    if c.hidden_size != H:
        raise HeadMismatch(f"head {path} has hidden size {c.hidden_size}, the target {H}")
    if c.vocab_size != V:
        raise HeadMismatch(f"head {path} has a vocabulary of {c.vocab_size} tokens, the target {V}")
    if c.feature_layers and target.backend != "torch":
        raise HeadMismatch(f"head {path} reads target layers {c.feature_layers}; the {target.backend} "
                           "backend returns only the last layer's state (use --backend torch)")
    w = load_file(str(path / WEIGHTS))
    if "t2d" in w:
        del w["t2d"]
    w = {k.replace("layers.0.", "midlayer."): v for k, v in w.items()}
    d2t = w.pop("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long)).long()
    embed, lm_rows = target.embedding_tables()
    embed = w.pop("embed_tokens.weight", embed).to(dtype)
    ids = torch.arange(c.draft_vocab_size) + d2t
    own = "lm_head.weight" in w
    head = DraftHead(c, embed, None if own else lm_rows(ids).to(dtype), d2t)
    missing, unexpected = head.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v
                                               for k, v in w.items()}, strict=False)
    missing = [k for k in missing if k != "d2t"]
    if missing or unexpected:
        raise ValueError(f"head {path}: missing tensors {missing}, unexpected tensors {unexpected}")
    return head.eval()
