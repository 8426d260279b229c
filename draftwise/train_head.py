"""`draftwise train-head`: a draft head for a target, trained on this machine.

1. Text (draftwise/head_text.py): the target's own greedy answers to instructions written or
   composed for this (none from an evaluation set), packed one after another, then Python's
   standard library source and the installed packages' documentation, in a fixed order. Nothing
   is read from draftwise's evaluation data (draftwise/data) or anything the benchmarks use.
2. Features (`extract`): the target runs over each chunk of text once, returning the last layer's
   normed state of every position (llama.cpp's prompt processing is the fast path) and its greedy
   token there; shards of ~20k tokens (fp16 features) under OUT/features with a manifest, written
   as they finish, so an interrupted extraction resumes at the next shard.
3. Training (`train`): the draft vocabulary is the most frequent greedy tokens of the data; the
   head is trained with EAGLE-3's training-time test: step 1 reads the target's features, step s
   reads the head's own output of step s-1 at the position before, attending over the target-fed
   positions before the chain and the chain's own earlier steps (as it drafts). Loss: cross-entropy
   against the target's distribution over the draft vocabulary (its LM head rows applied to its
   feature), weighted 0.8^(s-1). Progress (tokens/s, loss, top-1 agreement, ETA) on stderr; a
   checkpoint every `save_every` steps and at each epoch's end (OUT/train/ckpt.pt), so a rerun
   resumes; each epoch ends with teacher-forced acceptance per draft position on the held-out 5%
   (every 20th sequence), and on its answers alone. Training runs under bf16 autocast where that is
   faster at a training batch's rows (`_bf16`). `subsample` n trains on every n-th training
   sequence (the held-out slice unchanged): how acceptance grows with the text.
4. The head (config.json + bf16 model.safetensors) in OUT/head, the log in OUT/train/log.json.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from draftwise.head_text import answers, local_texts
from draftwise.models.head import DraftHead, HeadConfig, new_head, save_head

TRAIN_ROWS = 512  # rows of the products timed to choose the training precision (_bf16)


@dataclass(slots=True)
class TrainConfig:
    out: str
    max_tokens: int = 300_000  # text tokens to extract features for
    answers: int = 600  # instructions the target answers (its own text)
    answer_tokens: int = 192
    seq_len: int = 512
    draft_vocab: int = 8192
    intermediate: int = 1536
    ttt_steps: int = 3
    epochs: int = 2
    batch: int = 4
    lr: float = 6e-4
    save_every: int = 50
    seed: int = 0
    subsample: int = 1  # train on every n-th training sequence (the held-out slice unchanged): data scaling


# --- 2. features --------------------------------------------------------------------------

def features_of(runner, ids: list[int], layers: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of `ids` on a fresh sequence: (logits [n, V], the target's features [n, F])."""
    seq = runner.new_sequence()
    try:
        out = runner.forward_features([seq], [ids], [len(ids)], layers or [])
        return out.logits[0], out.features[0][-len(ids):]
    finally:
        runner.free(seq)


def extract(cfg: TrainConfig, runner, tok, log=None, gen=None) -> dict:
    """Features of the text under OUT/features (see the module docstring); returns the manifest.
    `gen`: the runner that writes the answers, or a function returning it (default `runner`)."""
    log = log or (lambda m: print(m, file=sys.stderr))
    root = Path(cfg.out) / "features"
    root.mkdir(parents=True, exist_ok=True)
    mpath = root / "manifest.json"
    man = json.loads(mpath.read_text()) if mpath.exists() else {
        "hidden_size": runner.hidden_size, "vocab_size": runner.vocab_size, "seq_len": cfg.seq_len,
        "model": (runner.identity() or {}).get("model", ""), "shards": [], "sources": {}, "seconds": 0.0, "done": False}
    if man["done"]:
        return man
    t0 = time.perf_counter()
    texts = local_texts()
    said = answers(gen or runner, tok, cfg.answers, cfg.answer_tokens, root / "answers.jsonl", log, texts=texts)
    man["answer_seconds"] = man.get("answer_seconds", 0.0) + time.perf_counter() - t0
    t0 = time.perf_counter()
    docs = [("answer/all", [t for _, ids in said for t in ids])]  # packed: chunks hold whole conversations and parts
    docs += [(src, tok.encode(text)) for src, text in texts]
    chunks = []  # (source, ids) of at most seq_len tokens, in order, up to max_tokens
    total = 0
    for src, ids in docs:
        for i in range(0, len(ids) - 16, cfg.seq_len):
            chunks.append((src, ids[i: i + cfg.seq_len]))
            total += len(chunks[-1][1])
            if total >= cfg.max_tokens:
                break
        if total >= cfg.max_tokens:
            break
    done = sum(s["sequences"] for s in man["shards"])
    shard = {"tokens": [], "feats": [], "argmax": [], "sources": []}
    for n, (src, ids) in enumerate(chunks[done:], done):
        logits, feats = features_of(runner, ids)  # [T, V], [T, H]
        shard["tokens"].append(torch.tensor(ids, dtype=torch.int32))
        shard["feats"].append(feats.half())
        shard["argmax"].append(logits.argmax(-1).int())
        shard["sources"].append(src.split("/")[0])
        man["sources"][src.split("/")[0]] = man["sources"].get(src.split("/")[0], 0) + len(ids)
        ntok = sum(len(t) for t in shard["tokens"])
        if ntok >= 20_000 or n == len(chunks) - 1:
            name = f"shard-{len(man['shards']):04d}.pt"
            torch.save(shard, root / name)
            man["shards"].append({"file": name, "tokens": ntok, "sequences": len(shard["tokens"])})
            man["seconds"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            mpath.write_text(json.dumps(man, indent=1))
            shard = {"tokens": [], "feats": [], "argmax": [], "sources": []}
        got = sum(s["tokens"] for s in man["shards"]) + sum(len(t) for t in shard["tokens"])
        log(f"features: {n + 1}/{len(chunks)} chunks, {got} tokens, "
            f"{got / max(man['seconds'] + time.perf_counter() - t0, 1e-9):.0f} tok/s")
    man["done"] = True
    mpath.write_text(json.dumps(man, indent=1))
    return man


# --- 3. training --------------------------------------------------------------------------

def _load_shards(root: Path, man: dict) -> list[dict]:
    seqs = []
    for s in man["shards"]:
        d = torch.load(root / s["file"])
        srcs = d.get("sources") or [""] * len(d["tokens"])
        seqs += [{"tokens": t.long(), "feats": f, "argmax": a.long(), "source": src}
                 for t, f, a, src in zip(d["tokens"], d["feats"], d["argmax"], srcs)]
    return [s for s in seqs if len(s["tokens"]) >= 8]


def draft_vocabulary(seqs: list[dict], size: int, vocab: int) -> torch.Tensor:
    """[size] target ids, ascending: the most frequent greedy tokens of the data."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(s["argmax"], minlength=vocab)
    return counts.topk(min(size, vocab)).indices.sort().values


def ttt_losses(head: DraftHead, tok: torch.Tensor, feats: torch.Tensor, greedy: torch.Tensor,
               steps: int, t2d: torch.Tensor):
    """The training-time test over a batch. tok: [B, T]; feats: [B, T, F]; greedy: [B, T] the
    target's greedy token after each position; t2d: [V] draft id of each target id (-1: none).
    Head position j reads token j and the feature of j-1 and predicts token j+1; chain i starts
    at position i+1 (the last target-fed position) and its step s sits at position i+s.
    -> (loss, top-1 agreement per step, alive per step: [B, T-s] whether chain i's first s drafts
    all equal the target's greedy tokens, the head's argmax draft ids [B, T-s] per step)."""
    B, T, _ = feats.shape
    n = T - 1
    with torch.no_grad():  # the target's distribution over the draft vocabulary at positions 1..T-1
        p = torch.softmax(head.target_logits(feats[:, 1:]), -1)  # [B, n, dv]
    want = t2d[greedy]  # [B, T] draft id of the target's greedy token (-1: outside the draft vocabulary)
    hid = head.fc(feats[:, :-1].to(head.fc.weight.dtype))  # [B, n, H]: position i+1 reads feature i
    past, loss, top1, alives, preds = None, 0.0, [], [], []
    alive = torch.ones(B, n, dtype=torch.bool)
    idx = torch.arange(n)
    for s in range(1, steps + 1):
        m = n - (s - 1)  # chains whose step s has a target: i + s <= T - 1
        mask = None  # step 1: causal
        if s > 1:  # step-1 keys up to the chain's start; the chain's own keys of steps 2..s
            P = past[0].shape[2]
            mask = torch.zeros(m, P + m, dtype=torch.bool)
            mask[:, :n] = torch.ones(m, n, dtype=torch.bool).tril()
            off = n
            for t in range(2, s):
                mask[idx[:m], off + idx[:m]] = True
                off += n - (t - 1)
            mask[idx[:m], P + idx[:m]] = True
        out, (k, v) = head.layer(tok[:, s: s + m], hid[:, :m], idx[:m] + s, past, mask)
        logits = head.logits(out)  # [B, m, dv]
        pt = p[:, s - 1: s - 1 + m]  # the target's distribution at position i + s
        loss = loss + (0.8 ** (s - 1)) * -(pt * torch.log_softmax(logits.float(), -1)).sum(-1).mean()
        with torch.no_grad():
            preds.append(logits.argmax(-1))
            hit = preds[-1] == want[:, s: s + m]
            fed = tok[:, s: s + m] == greedy[:, s - 1: s - 1 + m] if s > 1 else True  # the token fed is the draft
            alive = alive[:, :m] & hit & fed
            top1.append(hit.float().mean().item())
            alives.append(alive)
        past, hid = (k, v), out  # step s+1 of chain i reads step s's output of chain i
    return loss, top1, alives, preds


def _batches(seqs: list[dict], batch: int, gen: torch.Generator):
    order = torch.randperm(len(seqs), generator=gen).tolist()
    for i in range(0, len(order), batch):
        group = [seqs[j] for j in order[i: i + batch]]
        T = min(len(s["tokens"]) for s in group)
        yield (torch.stack([s["tokens"][:T] for s in group]), torch.stack([s["feats"][:T].float() for s in group]),
               torch.stack([s["argmax"][:T] for s in group]))


def evaluate(head: DraftHead, seqs: list[dict], steps: int, t2d: torch.Tensor, batch: int, bf16: bool = False) -> dict:
    """Teacher-forced acceptance per draft position on held-out sequences: of the chains whose
    first k-1 drafted tokens all equal the target's greedy tokens, the share whose k-th does."""
    hits = [0] * steps
    tot = [0] * steps
    with torch.no_grad():
        for tok, feats, am in _batches(seqs, batch, torch.Generator().manual_seed(0)):
            with _mixed(head, bf16):
                _, _, alive, _ = ttt_losses(head, tok, feats, am, steps, t2d)
            for s, a in enumerate(alive):
                hits[s] += int(a.sum())
                tot[s] += a.numel()
    return acceptance(hits, tot)


def acceptance(hits: list[int], chains: list[int]) -> dict:
    """Per draft position k: of the chains whose first k-1 drafts were accepted, the share whose
    k-th is; `chain`: P(the first k all accepted); their sum is the expected accepted length;
    `chains`: how many chains were scored at each position."""
    chain = [h / max(t, 1) for h, t in zip(hits, chains)]
    per_pos = [chain[0]] + [chain[s] / max(chain[s - 1], 1e-9) for s in range(1, len(chain))]
    return {"acceptance_per_position": per_pos, "chain": chain, "expected_accepted": sum(chain), "chains": list(chains)}


def train(cfg: TrainConfig, runner, log=None) -> dict:
    """Train (or resume) the head on OUT/features; returns the log (see the module docstring)."""
    log = log or (lambda m: print(m, file=sys.stderr))
    root = Path(cfg.out)
    man = json.loads((root / "features" / "manifest.json").read_text())
    seqs = _load_shards(root / "features", man)
    held_seqs = seqs[19::20]  # every 20th sequence (5%, answers and other text alike): never trained on
    train_seqs = [s for i, s in enumerate(seqs) if i % 20 != 19][::cfg.subsample]  # every n-th: the same mix
    held = len(held_seqs)
    H, V = runner.hidden_size, runner.vocab_size
    ids = draft_vocabulary(train_seqs, cfg.draft_vocab, V)
    t2d = torch.full((V,), -1, dtype=torch.long)
    t2d[ids] = torch.arange(len(ids))
    emb, rows = runner.embedding_tables()
    nh = max(1, H // 128)
    hc = HeadConfig(H, nh, max(1, nh // 6) if nh % 6 == 0 else nh, H // nh, cfg.intermediate, V, len(ids),
                    [], 1e-6, 1_000_000.0, target=Path((runner.identity() or {}).get("model", "")).name)
    head = new_head(hc, emb, rows(ids), ids - torch.arange(len(ids)), cfg.seed)
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
    steps_per_epoch = math.ceil(len(train_seqs) / cfg.batch)
    total = steps_per_epoch * cfg.epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / 20) * max(0.05, 1 - i / total))
    tdir = root / "train"
    tdir.mkdir(parents=True, exist_ok=True)
    ckpt = tdir / "ckpt.pt"
    state = {"step": 0, "epochs": [], "seconds": 0.0, "tokens": 0}
    if ckpt.exists():
        c = torch.load(ckpt)
        head.load_state_dict(c["head"], strict=False)
        opt.load_state_dict(c["opt"])
        sched.load_state_dict(c["sched"])
        state = c["state"]
        log(f"resumed at step {state['step']} of {total}")
    cover = sum(int((t2d[s["argmax"]] >= 0).sum()) for s in held_seqs) / sum(len(s["argmax"]) for s in held_seqs)
    bf16 = _bf16(head)  # timed once: the products' precision for every batch
    autocast = "bfloat16" if bf16 else "float32"
    log(f"head: {sum(p.numel() for p in head.parameters() if p.requires_grad) / 1e6:.1f} M trainable parameters; "
        f"draft vocabulary {len(ids)} covers {cover:.1%} of the held-out greedy tokens; "
        f"{len(train_seqs)} training / {held} held-out sequences; {total} steps; products in {autocast}")
    t0, base = time.perf_counter(), state["seconds"]
    tok_since, ema = 0, None
    while state["step"] < total:
        epoch = state["step"] // steps_per_epoch
        gen = torch.Generator().manual_seed(cfg.seed + epoch)
        for i, (tok, feats, am) in enumerate(_batches(train_seqs, cfg.batch, gen)):
            if epoch * steps_per_epoch + i < state["step"]:
                continue  # resumed: this epoch's batches already trained on
            with _mixed(head, bf16):
                loss, top1, _, _ = ttt_losses(head, tok, feats, am, cfg.ttt_steps, t2d)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            sched.step()
            state["step"] += 1
            state["tokens"] += tok.numel()
            tok_since += tok.numel()
            ema = (loss.item(), top1[0]) if ema is None else (0.9 * ema[0] + 0.1 * loss.item(), 0.9 * ema[1] + 0.1 * top1[0])
            el = time.perf_counter() - t0
            rate = tok_since / el
            eta = (total - state["step"]) * tok.numel() / max(rate, 1e-9)
            print(f"\rstep {state['step']}/{total} | {rate:.0f} tok/s | loss {ema[0]:.3f} | top-1 {ema[1]:.3f} | "
                  f"ETA {eta / 60:.1f} min   ", end="", file=sys.stderr, flush=True)
            if state["step"] % cfg.save_every == 0:
                _save(ckpt, head, opt, sched, state, base + el)
            if state["step"] >= total:
                break
        print(file=sys.stderr)
        ev = evaluate(head, held_seqs, cfg.ttt_steps, t2d, cfg.batch, bf16)
        chat = [s for s in held_seqs if s["source"] == "answer"]
        if chat:  # the target's own answers alone: the text a head drafts in generation
            ev["answers"] = evaluate(head, chat, cfg.ttt_steps, t2d, cfg.batch, bf16)
        state["epochs"].append({"epoch": epoch + 1, "step": state["step"], **ev, "train_loss": ema[0],
                                "train_top1": ema[1]})
        log(f"epoch {epoch + 1}: held-out teacher-forced acceptance per position "
            f"{', '.join(f'{a:.3f}' for a in ev['acceptance_per_position'])}; "
            f"expected accepted of {cfg.ttt_steps}: {ev['expected_accepted']:.2f}"
            + (f"; on the target's answers {', '.join(f'{a:.3f}' for a in ev['answers']['acceptance_per_position'])}"
               if "answers" in ev else ""))
        _save(ckpt, head, opt, sched, state, base + time.perf_counter() - t0)
        t0, base, tok_since = time.perf_counter(), state["seconds"], 0
    save_head(head, root / "head")
    out = {"config": asdict(cfg), "features": {k: man.get(k) for k in ("sources", "seconds", "answer_seconds", "model")},
           "feature_tokens": sum(s["tokens"] for s in man["shards"]), "draft_vocab_coverage": cover,
           "train_seconds": state["seconds"], "train_tokens": state["tokens"], "autocast": autocast, "epochs": state["epochs"],
           "head_params": sum(p.numel() for p in head.weights().values())}
    (tdir / "log.json").write_text(json.dumps(out, indent=1))
    return out


def _bf16(head: DraftHead) -> bool:
    """Whether the head's products over a training batch's rows run clearly faster in bf16: on
    CUDA, and on a CPU where head_runner.fastest_dtype picks it for TRAIN_ROWS rows (2.5x the
    training tokens/s on the AMD EPYC machine type). The rows matter: for a drafted token's one
    row bf16 can be level with fp32 where for 512 rows it is much faster (the Intel Xeon type)."""
    from draftwise.backends.head_runner import fastest_dtype

    return head.fc.weight.device.type == "cuda" or fastest_dtype(head, rows=TRAIN_ROWS) == torch.bfloat16


def _mixed(head: DraftHead, on: bool) -> torch.autocast:
    """bf16 autocast where `on` (`_bf16`); weights and gradients stay fp32."""
    return torch.autocast(head.fc.weight.device.type, dtype=torch.bfloat16, enabled=on)


def _save(path: Path, head, opt, sched, state: dict, seconds: float) -> None:
    state["seconds"] = seconds  # training wall time so far, resumed runs included
    torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "state": state},
               path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
