"""Fakes for constrained decoding: a tokenizer of JSON pieces llguidance can read, a runner whose
next-token logits are a fixed random table row per last token (so distributions are spread out),
and a drafter that samples its draft from another such table."""
import torch

from draftwise.drafters.base import Proposal
from draftwise.sampling import warp
from fakes import CheapDrafter, CycleRunner

PIECES = ['{', '}', '"', ':', ',', ' ', '[', ']', 'a', 'b', 'c', 'x', 'y', '0', '1', '2',
          'true', 'false', '{"', '": ', ', "', '"}', '", "', 'ab', '<eos>']
EOS = len(PIECES) - 1


class JsonTokenizer:
    """Token t is PIECES[t]; encoding takes the longest piece first; the last token is EOS."""

    def __init__(self):
        self.tokens = [p.encode() for p in PIECES[:-1]] + [b"<eos>"]
        self.eos_token_ids = frozenset({EOS})

    def encode_bytes(self, data: bytes) -> list[int]:
        out, i = [], 0
        while i < len(data):
            t = max((t for t, p in enumerate(self.tokens[:-1]) if data.startswith(p, i)), key=lambda t: len(self.tokens[t]))
            out.append(t)
            i += len(self.tokens[t])
        return out

    def encode(self, text: str) -> list[int]:
        return self.encode_bytes(text.encode())

    def decode(self, ids: list[int]) -> str:
        return "".join(PIECES[t] for t in ids if t != EOS)

    def fingerprint(self) -> str:
        return "json-pieces"

    def __len__(self) -> int:
        return len(PIECES)


class TableRunner(CycleRunner):
    """Logits after token t: row t of a seeded random table (scale sets how peaked)."""

    def __init__(self, vocab=len(PIECES), seed=0, scale=2.0, **kw):
        super().__init__(vocab=vocab, **kw)
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * scale

    def logits_after(self, t):
        return self.table[t].clone()


class TableDrafter(CheapDrafter):
    """Drafts by sampling its own table (warped as the target's rows are): a drafter that is often
    wrong and sometimes refused by the grammar; greedy: its table's argmax."""
    name = "table"

    def __init__(self, vocab=len(PIECES), seed=1, scale=2.0):
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(seed)) * scale

    def propose(self, seq_key, context, num_tokens, params, generator, stop=None):
        toks, rows, last = [], [], context[-1]
        for _ in range(num_tokens):
            logits = self.table[last][None]
            if params.greedy:
                last = int(logits.argmax())
            else:
                q = warp(logits, params)[0]
                rows.append(q)
                last = int(torch.multinomial(q, 1, generator=generator))
            toks.append(last)
        return Proposal(toks, torch.stack(rows) if rows else None)
