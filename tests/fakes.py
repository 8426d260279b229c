"""A toy model runner, a cheap drafter to build test drafters on, and a tokenizer for fast engine
tests: logits depend on the last token only."""
import torch

from draftwise.backends.base import KVState, Weights, padded_parts
from draftwise.drafters.base import Proposal


class CycleRunner:
    """Next token after t is (t + 1) % period, as a peaked but not one-hot distribution."""
    backend = "fake"
    n_seq_max = None
    trees = True  # logits depend on the token alone, so a tree's are its tokens' own
    saves = True
    returns_features = features_free = False
    forward_parts = staticmethod(padded_parts)

    def __init__(self, vocab=16, period=5, max_context=512, sharp=8.0):
        self.vocab_size, self.period, self.max_context, self.sharp = vocab, period, max_context, sharp
        self.seqs: dict[int, list[int]] = {}
        self.forwards: list[list[int]] = []  # sequences per forward call
        self._next = 0

    def identity(self):  # no model file: its cost curve is not cached
        return None

    def weights(self):
        return Weights(None, "fake")

    def new_sequence(self):
        self._next += 1
        self.seqs[self._next] = []
        return self._next

    def logits_after(self, t):
        row = torch.zeros(self.vocab_size)
        row[(t + 1) % self.period] = self.sharp
        return row

    def forward(self, seq_ids, tokens, num_logits, parents=None):
        self.forwards.append(list(seq_ids))
        out = []
        for s, toks, k in zip(seq_ids, tokens, num_logits):
            self.seqs[s] += toks
            out.append(torch.stack([self.logits_after(t) for t in toks[len(toks) - k:]]) if k else torch.zeros(0, self.vocab_size))
        return out

    def truncate(self, s, n):
        assert 0 <= n <= len(self.seqs[s])
        del self.seqs[s][n:]

    def keep(self, s, n, rows):
        assert all(n <= r < len(self.seqs[s]) for r in rows) and rows == sorted(rows)
        self.seqs[s] = self.seqs[s][:n] + [self.seqs[s][r] for r in rows]

    def length(self, s):
        return len(self.seqs[s])

    def free(self, s):
        del self.seqs[s]

    def kv_bytes(self):
        return 64 * sum(map(len, self.seqs.values()))

    def save(self, s):
        return KVState(len(self.seqs[s]), 64 * len(self.seqs[s]), list(self.seqs[s]))

    def restore(self, s, state):
        assert not self.seqs[s]
        self.seqs[s] = list(state.data)


class CheapDrafter:
    """A cheap drafter that proposes nothing: a test drafter overrides `propose`."""
    name, max_context, cheap, runner, runners, tree, features = "cheap", None, True, None, (), False, None

    def propose(self, seq_key, context, num_tokens, params, generator, stop=None):
        return Proposal([])

    def pending(self, seq_key, context):
        return 0

    def isolate(self, seq_key):
        pass

    def predict(self, seq_key, tokens, start):
        pass

    def release(self, seq_key, context=None):
        pass

    def memory_nodes(self):
        return 0


class CharTokenizer:
    """Token t decodes to chr(ord('a') + t); token 15 is EOS."""

    def __init__(self, eos=15):
        self.eos_token_ids = frozenset({eos})

    def encode(self, text):
        return [ord(c) - ord("a") for c in text]

    def decode(self, ids):
        return "".join(chr(ord("a") + t) for t in ids if t not in self.eos_token_ids)

    def fingerprint(self):
        return "chars"

    def __len__(self):
        return 16
