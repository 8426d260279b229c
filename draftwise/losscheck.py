"""`draftwise verify`: check that speculation is lossless, by comparing it with plain decoding.

- Temperature 0: the outputs must be identical token for token; the first divergence is reported
  with both continuations.
- Temperature > 0: N continuations are drawn with and without speculation (independent seeds, so
  the two samples are independent). At each output position j = 1..m (position 0 is sampled from
  the prompt's logits on both paths: nothing is drafted there) the two
  samples of the token at j must come from the same distribution: a chi-square test of
  homogeneity over the frequent tokens (rare ones pooled so every expected count is >= 5), the
  G-test on the same table, and the total-variation distance with a bootstrap 95% interval.
  Positions are tested with a Bonferroni-corrected level.

What a check can detect is bounded twice:
1. Sample size. Two distributions at total-variation distance d differ by d on some event; a
   two-proportion test on that event with n samples per side detects d with the asked power when
   n >= (z_{1-a/2} + z_{power})^2 / (2 d^2) (variance at its worst, p = 1/2). `required_samples`
   computes it. The chi-square and G-tests reach that power when the bias is a two-way split;
   over more categories they spread it over more degrees of freedom and have less (measured in
   docs/verify.md), so size a check for a TV below the bias it must see, or at a higher power.
2. Rejections. A wrong acceptance rule only changes what happens after a rejection, so at a
   position where a fraction r of the samples had a rejection, it can move the output
   distribution by at most r in total variation. A position is *tested* only if its rejections
   reach d * n; a check whose draft was (almost) never rejected tested nothing, and says so.
And for the known bug (resample from p after a rejection) the bias it would cause at position 1
is computed exactly from the models (`draftwise.bugbias`), so the report says whether this check
could see that bug on these prompts.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from contextlib import closing
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from scipy.stats import chi2_contingency, norm

from draftwise.bugbias import BugBias, predict_bug_bias
from draftwise.compare import first_divergence
from draftwise.engine import Engine
from draftwise.sampling import SamplingParams
from draftwise.verify import VerifyResult, first_rejection, rejection_sample_tree

ENDED = -1  # the sample stopped (EOS) before this position


def required_samples(min_tv: float, alpha: float = 0.05, power: float = 0.8, n_tests: int = 1) -> int:
    """Samples per side to detect a total-variation distance of min_tv (see the module docstring)."""
    if not 0 < min_tv < 1 or not 0 < alpha < 1 or not 0 < power < 1:
        raise ValueError("min_tv, alpha and power must be in (0, 1)")
    z = norm.ppf(1 - alpha / (2 * n_tests)) + norm.ppf(power)
    return math.ceil(z * z / (2 * min_tv * min_tv))


def homogeneity_test(a: list[int], b: list[int], min_expected: float = 5.0) -> tuple[float, float, float, int]:
    """(chi-square p-value, G-test p-value, G statistic, categories) for two samples of tokens."""
    ca, cb = Counter(a), Counter(b)
    n_a, n_b = len(a), len(b)
    frac = min(n_a, n_b) / (n_a + n_b)
    keep = [t for t in set(ca) | set(cb) if (ca[t] + cb[t]) * frac >= min_expected]
    table = [[ca[t] for t in keep], [cb[t] for t in keep]]
    other = (n_a - sum(table[0]), n_b - sum(table[1]))
    if other[0] + other[1] > 0:
        table[0].append(other[0])
        table[1].append(other[1])
    if len(table[0]) < 2:
        return 1.0, 1.0, 0.0, len(table[0])  # one category: nothing can differ
    t = np.array(table)
    p = chi2_contingency(t, correction=False).pvalue
    g = chi2_contingency(t, correction=False, lambda_="log-likelihood")
    return float(p), float(g.pvalue), float(g.statistic), len(table[0])


def tv_distance(a: list[int], b: list[int]) -> float:
    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[t] / len(a) - cb[t] / len(b)) for t in set(ca) | set(cb))


def tv_bootstrap(a: list[int], b: list[int], n_boot: int = 500, seed: int = 0) -> tuple[float, float, float]:
    rng = random.Random(seed)
    boots = sorted(tv_distance(rng.choices(a, k=len(a)), rng.choices(b, k=len(b))) for _ in range(n_boot))
    return tv_distance(a, b), boots[int(0.025 * n_boot)], boots[int(0.975 * n_boot) - 1]


@dataclass(slots=True)
class PositionResult:
    prompt: int
    position: int
    rejections: int  # spec samples with a rejection (a recovered token) at this position
    tested: bool  # rejections >= min_tv * samples
    chi2_p: float
    g_p: float
    categories: int
    tv: float
    tv_lo: float
    tv_hi: float
    significant: bool


@dataclass(slots=True)
class SamplingReport:
    samples: int
    positions: int
    min_tv: float
    alpha: float
    power: float
    required_samples: int
    required_rejections: int
    results: list[PositionResult] = field(default_factory=list)
    bug_bias: list[BugBias] = field(default_factory=list)  # per prompt, at position 1 (if predicted)
    rounds: int = 0  # the speculative draws' verification rounds, to the last tested position
    tree_rounds: int = 0  # ... of which the draft was a candidate tree

    @property
    def verdict(self) -> str:
        if any(r.significant for r in self.results):
            return "FAIL"
        if not any(r.tested for r in self.results):
            return "UNTESTED"
        return "PASS" if self.samples >= self.required_samples else "UNDERPOWERED"

    def summary(self) -> str:
        rej = sum(r.rejections for r in self.results)
        lines = [f"verdict: {self.verdict}",
                 f"samples per side {self.samples} (power calculation: {self.required_samples} to detect "
                 f"TV >= {self.min_tv} at alpha {self.alpha} with power {self.power}, Bonferroni over "
                 f"{len(self.results)} positions)",
                 f"rejections at tested positions: {rej} in all; a position counts as tested with "
                 f">= {self.required_rejections}",
                 *([f"candidate trees: {self.tree_rounds} of the speculative draws' {self.rounds} "
                    "verification rounds to the tested positions"] if self.tree_rounds else []),
                 "prompt pos  rejections  tested  categories  chi2 p     G p        TV [95% CI]"]
        for r in self.results:
            lines.append(f"{r.prompt:6d} {r.position:3d}  {r.rejections:10d}  {str(r.tested):6}  {r.categories:10d}  "
                         f"{r.chi2_p:9.2e}  {r.g_p:9.2e}  {r.tv:.3f} [{r.tv_lo:.3f}, {r.tv_hi:.3f}]"
                         + ("  <- differs" if r.significant else ""))
        for i, b in enumerate(self.bug_bias):
            ok = b.tv - b.untracked >= self.min_tv
            lines.append(f"prompt {i}: the known bug (resample-from-p) would move position 1 by TV {b.tv:.3f} "
                         f"(+-{b.untracked:.3f}: first tokens not followed), {'>=' if ok else '<'} min-tv "
                         f"{self.min_tv}: this check is {'' if ok else 'not '}sized to see it")
        if self.verdict == "UNTESTED":
            lines.append("the draft was (almost) never rejected at these positions: this check tested nothing")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {**{k: getattr(self, k) for k in ("samples", "positions", "min_tv", "alpha", "power",
                                                 "required_samples", "required_rejections", "verdict",
                                                 "rounds", "tree_rounds")},
                "results": [asdict(r) for r in self.results], "bug_bias": [asdict(b) for b in self.bug_bias]}


def _draw(engine: Engine, ids: list[int], m: int, keep: int, seeds: range, kw: dict,
          rep=None) -> tuple[list[list[int]], list[list]]:
    """Per seed, the first `keep` tokens of a request for `m` (ENDED-padded) and its rounds up to
    them: a draw stops once they are committed (the later ones are not tested), its prompt's KV
    kept for the next draw. `m` > `keep` leaves the tested rounds room for a full draft."""
    outs, rounds = [], []
    for s in seeds:
        toks, rs = [], []
        with closing(engine.stream(ids, max_tokens=m, seed=s, private=True, **kw)) as chunks:  # one drafter state
            for chunk in chunks:
                toks += chunk.token_ids
                rs += [chunk.round] if chunk.round is not None else []
                if len(toks) >= keep:
                    break
        outs.append((toks + [ENDED] * keep)[:keep])
        rounds.append(rs)
        if rep is not None:
            rep.rounds += len(rs)
            rep.tree_rounds += sum(r.tree for r in rs)
    engine.release()  # the kept prompt state: several engines may share one runner
    return outs, rounds


def check_sampling(plain: Engine, spec: Engine, prompts: list[list[int]], temperature: float, top_p: float = 1.0,
                   top_k: int = 0, samples: int | None = None, positions: int = 3, min_tv: float = 0.1,
                   alpha: float = 0.05, power: float = 0.8, plain_samples: dict | None = None,
                   predict_bias: bool = True, progress=None, constraint=None) -> SamplingReport:
    """Compare N speculative and N plain samples of the first `positions` tokens of each prompt.
    `plain_samples` (prompt index -> samples) lets several checks share one plain run;
    `predict_bias` also computes the bias the known bug would cause at position 1 per prompt
    (unconstrained only: the prediction does not apply the grammar's mask). `constraint` (a
    draftwise.grammar.Grammar): the constrained mode, both sides following the grammar."""
    if temperature <= 0:
        raise ValueError("the sampling check needs temperature > 0; use check_greedy at 0")
    n_tests = positions * len(prompts)
    need = required_samples(min_tv, alpha, power, n_tests)
    n = samples or need
    rep = SamplingReport(n, positions, min_tv, alpha, power, need, math.ceil(min_tv * n))
    kw = dict(temperature=temperature, top_p=top_p, top_k=top_k, constraint=constraint)
    predict_bias = predict_bias and constraint is None
    for i, ids in enumerate(prompts):
        if plain_samples is not None and i in plain_samples:
            base = plain_samples[i]
        else:
            base, _ = _draw(plain, ids, positions + 1, positions + 1, range(10**6, 10**6 + n), kw)
            if plain_samples is not None:
                plain_samples[i] = base
        # room for a full draft at every tested position, so drafting is as in normal use
        draws, rounds = _draw(spec, ids, positions + 1 + spec.max_draft, positions + 1, range(n), kw, rep)
        rejected_at = Counter(r.position + r.accepted for rs in rounds for r in rs if r.rejected)
        for j in range(1, positions + 1):  # position 0 comes from the prompt's logits: never drafted
            a, b = [o[j] for o in draws], [o[j] for o in base[:n]]
            chi_p, g_p, _, cats = homogeneity_test(a, b)
            tv, lo, hi = tv_bootstrap(a, b)
            rej = rejected_at.get(j, 0)
            rep.results.append(PositionResult(i, j, rej, rej >= rep.required_rejections, chi_p, g_p, cats,
                                              tv, lo, hi, min(chi_p, g_p) < alpha / n_tests))
        if predict_bias:  # after the draws: the engines have released their kept prompt state
            rep.bug_bias.append(predict_bug_bias(spec.target, spec.drafter, spec.tokenizer.eos_token_ids, ids,
                                                 SamplingParams(temperature, top_p, top_k),
                                                 nodes=spec.max_draft if spec.drafter.tree else 1))
        if progress:
            progress(i)
    return rep


@dataclass(slots=True)
class GreedyReport:
    prompts: int
    divergences: list[dict] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return "PASS" if not self.divergences else "FAIL"

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "prompts": self.prompts, "divergences": self.divergences}

    def summary(self) -> str:
        lines = [f"verdict: {self.verdict} ({self.prompts - len(self.divergences)}/{self.prompts} prompts identical)"]
        for d in self.divergences:
            lines.append(f"prompt {d['prompt']}: first divergence at output position {d['position']}\n"
                         f"  plain:       {d['plain_text']!r}\n  speculative: {d['spec_text']!r}")
        return "\n".join(lines)


def check_greedy(plain: Engine, spec: Engine, prompts: list[list[int]], max_tokens: int = 64,
                 constraint=None) -> GreedyReport:
    """`constraint` (a draftwise.grammar.Grammar): speculation against constrained plain decoding."""
    rep = GreedyReport(len(prompts))
    tok = plain.tokenizer
    for i, ids in enumerate(prompts):
        a = plain.generate(ids, max_tokens=max_tokens, constraint=constraint).token_ids
        plain.release()  # the kept prompt state: the engines share one runner, which may hold one sequence
        b = spec.generate(ids, max_tokens=max_tokens, constraint=constraint).token_ids
        spec.release()
        j = first_divergence(a, b)
        if j is not None:
            rep.divergences.append({"prompt": i, "position": j, "plain_text": tok.decode(a[j:]),
                                    "spec_text": tok.decode(b[j:])})
    return rep


def resample_from_p(target_probs, draft_probs, draft_tokens, generator):
    """A deliberately WRONG acceptance rule (resamples from p, not the residual, after a
    rejection), for showing that the check catches it. Never use it to generate."""
    n = first_rejection(target_probs, draft_probs, draft_tokens, generator)
    last = torch.multinomial(target_probs[n], 1, generator=generator)  # the bug: p, not max(0, p - q)
    return VerifyResult(draft_tokens[:n].tolist() + [int(last)], n, draft_tokens.shape[0])


def resample_from_p_tree(target_probs, draft_probs, draft_tokens, parents, generator):
    """The same WRONG rule on a candidate tree: where every child of the last node reached was
    rejected, the emitted token is redrawn from that node's p instead of the residual."""
    res = rejection_sample_tree(target_probs, draft_probs, draft_tokens, parents, generator)
    if res.leaf:  # all accepted down to a leaf: a bonus from p, right in both rules
        return res
    row = res.path[-1] + 1 if res.path else 0
    last = int(torch.multinomial(target_probs[row], 1, generator=generator))  # the bug
    return VerifyResult(res.tokens[:-1] + [last], res.num_accepted, res.num_proposed, res.path, res.leaf)


# an injectable wrong acceptance rule: the Engine keywords that put it on chains and trees
BUGS = {"resample-from-p": {"sampler": resample_from_p, "tree_sampler": resample_from_p_tree},
        "resample-from-p-trees": {"tree_sampler": resample_from_p_tree}}  # on tree rounds only
