"""Speculation statistics: counted per request, merged for aggregates, derived in one place.

Counters (words as defined in `draftwise.verify`):
- proposed_tokens: draft tokens sent to verification.
- accepted_draft_tokens: proposed tokens the target accepted.
- emitted_tokens: tokens delivered to the user (after stop truncation), from all steps.
- verification_rounds: target steps that verified at least one draft token.
- round_emitted_tokens: emitted tokens that came from verification rounds (accepted + recovered
  or bonus, minus those discarded).
- plain_steps: target steps with no draft, each emitting one token; the prefill step that emits
  the first token counts as one.
- discarded_tokens: tokens produced by a step but cut by a stop.
- proposed_per_position[i] / accepted_per_position[i]: the same counts for draft position i
  (a candidate tree: rounds whose tree reached depth i + 1, and accepted paths that did).
- tree_rounds: verification rounds whose draft was a candidate tree (branching); their
  proposed_tokens are its nodes, all verified in the one forward.
- cached_tokens: prompt tokens whose KV came from the prompt cache (or a kept prompt), not the
  prefill (OpenAI's usage.prompt_tokens_details.cached_tokens).
Times in seconds: prefill_s (prompt forward, first token), draft_s, verify_s (target forwards
and the acceptance test of rounds and plain steps), other_s (the rest of wall_s: bookkeeping,
stop checks, detokenising, callbacks); grammar_s: of these, the time in a constrained request's
grammar (masks, walks through drafts, rollbacks: draftwise.grammar).

Derived:
- acceptance_rate = accepted_draft_tokens / proposed_tokens
- acceptance_length (AL) = round_emitted_tokens / verification_rounds, counting the recovered or
  bonus token, so AL is in [1, D+1]
- ms_per_emitted_token = 1000 * wall_s / emitted_tokens
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass(slots=True)
class SpecStats:
    proposed_tokens: int = 0
    accepted_draft_tokens: int = 0
    emitted_tokens: int = 0
    verification_rounds: int = 0
    round_emitted_tokens: int = 0
    plain_steps: int = 0
    discarded_tokens: int = 0
    tree_rounds: int = 0
    cached_tokens: int = 0
    proposed_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    wall_s: float = 0.0
    grammar_s: float = 0.0
    requests: int = 1
    # with --num-draft-tokens auto: measured prefill plus the planner's predicted seconds for the
    # steps it planned, and the same for plain steps emitting the same expected tokens (their
    # ratio is its predicted speedup)
    predicted_s: float = 0.0
    predicted_plain_s: float = 0.0

    def record_round(self, proposed: int, accepted: int, depth: int | None = None) -> None:
        """`depth`: a candidate tree's depth (its positions); None: a chain of `proposed`."""
        self.verification_rounds += 1
        self.proposed_tokens += proposed
        self.accepted_draft_tokens += accepted
        self.tree_rounds += depth is not None
        _grow(self.proposed_per_position, proposed if depth is None else depth)
        _grow(self.accepted_per_position, accepted)
        self.accepted_per_position.extend([0] * (len(self.proposed_per_position) - len(self.accepted_per_position)))

    def merge(self, other: SpecStats) -> SpecStats:
        """Aggregate: counts and times add up; derived metrics are recomputed from the sums."""
        out = SpecStats(requests=0)
        for f in fields(SpecStats):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, list):
                n = max(len(a), len(b))
                setattr(out, f.name, [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)])
            else:
                setattr(out, f.name, a + b)
        return out

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_draft_tokens / self.proposed_tokens if self.proposed_tokens else None

    @property
    def acceptance_length(self) -> float | None:
        return self.round_emitted_tokens / self.verification_rounds if self.verification_rounds else None

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / p for a, p in zip(self.accepted_per_position, self.proposed_per_position) if p]

    @property
    def ms_per_emitted_token(self) -> float | None:
        return 1000.0 * self.wall_s / self.emitted_tokens if self.emitted_tokens else None

    @property
    def predicted_speedup(self) -> float | None:
        return self.predicted_plain_s / self.predicted_s if self.predicted_s > 0 else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.emitted_tokens / self.wall_s if self.wall_s > 0 else None

    def to_dict(self) -> dict:
        d = asdict(self)
        for k in ("acceptance_rate", "acceptance_length", "per_position_acceptance",
                  "ms_per_emitted_token", "tokens_per_s", "predicted_speedup"):
            d[k] = getattr(self, k)
        return d


def aggregate(stats: list[SpecStats]) -> SpecStats:
    out = SpecStats(requests=0)
    for s in stats:
        out = out.merge(s)
    return out


def _grow(counts: list[int], upto: int) -> None:
    """Add one to counts[0:upto], extending the list as needed."""
    if len(counts) < upto:
        counts.extend([0] * (upto - len(counts)))
    for i in range(upto):
        counts[i] += 1


_ROWS = (
    ("emitted_tokens", "{:d}"), ("tokens_per_s", "{:.2f}"), ("ms_per_emitted_token", "{:.1f}"),
    ("proposed_tokens", "{:d}"), ("accepted_draft_tokens", "{:d}"), ("acceptance_rate", "{:.3f}"),
    ("acceptance_length", "{:.2f}"), ("verification_rounds", "{:d}"), ("tree_rounds", "{:d}"),
    ("plain_steps", "{:d}"),
    ("discarded_tokens", "{:d}"), ("prefill_s", "{:.2f}"), ("draft_s", "{:.2f}"), ("verify_s", "{:.2f}"),
    ("other_s", "{:.3f}"), ("grammar_s", "{:.3f}"), ("wall_s", "{:.2f}"),
)


def format_table(columns: dict[str, SpecStats]) -> str:
    """Stats side by side, one column per configuration, one row per metric."""
    names = list(columns)
    width = max(12, *(len(n) for n in names))
    lines = [f"{'metric':<22}" + "".join(f"{n:>{width + 2}}" for n in names)]
    for key, fmt in _ROWS:
        cells = []
        for n in names:
            v = getattr(columns[n], key)
            cells.append("-" if v is None else fmt.format(v))
        lines.append(f"{key:<22}" + "".join(f"{c:>{width + 2}}" for c in cells))
    return "\n".join(lines)
