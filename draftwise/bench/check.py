"""The output check: at temperature 0 every output must equal the baseline's, token for token.

Each request is compared with the baseline's output for the same prompt in the same repeat and
concurrency (else the baseline's first); the baseline's own repeats are compared with its first,
so a nondeterministic baseline shows up too. A configuration on another backend (`NAME@B`) is
compared with plain decoding on that backend (`plain@B`) where the run has it: speculation is exact
against its own model, and a converted model moves near-ties of its own; `plain@B` itself is
compared with the baseline (what the conversion changed). Servers return token ids only if they are draftwise's
(`return_token_ids`); with logprobs (asked for at temperature 0) they return each token's text and
top-2 logprobs, so outputs are compared token by token (by the tokens' text) and the margin at a
divergence is top-1 minus top-2 logprob — the same as the logit margin, since both logprobs share
one normaliser. Otherwise (or where a server's logprobs cover only part of its output, as
llama-server's with a draft model) outputs are compared by text and the position is a character
index. An answer with tool calls (a server's `tool_calls`, its text empty) is compared by its text
followed by each call's name and arguments (parsed, keys sorted: the same call in another layout is
the same answer).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from draftwise.compare import first_divergence


@dataclass(slots=True)
class Mismatch:
    prompt_id: str
    config: str
    repeat: int
    concurrency: int
    unit: str  # "token" | "char": what position counts
    position: int
    baseline: int | str | None  # the baseline's token (or character) there; None past its end
    other: int | str | None
    key: str  # the request's results key
    reference_key: str  # the baseline request it was compared with
    margin_single: float | None = None  # target's top-1 minus top-2 logit there (see compare.py);
    margin_batched: float | None = None  # for a server: in the baseline's output / in this one

    def to_dict(self) -> dict:
        return asdict(self)


def reference_config(config: str, baseline: str, configs: set[str]) -> str:
    """The configuration `config`'s outputs are compared with: `plain@B` for `NAME@B` (NAME not
    plain, B not the baseline's backend) where the run has it, else the baseline (plain@B's own)."""
    name, at, backend = config.rpartition("@")
    own = f"plain@{backend}"
    if at and name != "plain" and own in configs and not baseline.endswith(f"@{backend}"):
        return own
    return baseline


def _reference(requests: list[dict], baseline: str, configs: set[str]) -> dict[str, tuple[dict, dict]]:
    """By reference configuration: (its rows by (prompt, repeat, concurrency), its first row by prompt)."""
    refs = {c: ({}, {}) for c in {reference_config(c, baseline, configs) for c in configs}}
    for r in sorted(requests, key=lambda r: r.get("order", 0)):
        if r["config"] in refs:
            same, first = refs[r["config"]]
            same.setdefault((r["prompt_id"], r["repeat"], r["concurrency"]), r)
            first.setdefault(r["prompt_id"], r)
    return refs


def compare_outputs(ref: dict, r: dict) -> tuple[str, int, object, object] | None:
    """(unit, position, baseline item, other item) at the first difference, or None if equal."""
    if ref.get("token_ids") is not None and r.get("token_ids") is not None:
        a, b, unit = ref["token_ids"], r["token_ids"], "token"
    elif _whole(ref) and _whole(r):
        a, b, unit = ref["tokens"], r["tokens"], "token"
    else:
        a, b, unit = _answer(ref), _answer(r), "char"
    i = first_divergence(list(a), list(b))
    if i is None:
        return None
    return unit, i, a[i] if i < len(a) else None, b[i] if i < len(b) else None


def find_mismatches(requests: list[dict], baseline: str, divergences: dict[str, dict] | None = None
                    ) -> tuple[list[Mismatch], int]:
    """(mismatches, number of outputs checked). `divergences` adds margins by request key."""
    configs = {r["config"] for r in requests}
    refs = _reference(requests, baseline, configs)
    out, checked = [], 0
    for r in sorted(requests, key=lambda r: r.get("order", 0)):
        key = (r["prompt_id"], r["repeat"], r["concurrency"])
        rc = reference_config(r["config"], baseline, configs)
        same, first = refs[rc]
        ref = first.get(r["prompt_id"]) if r["config"] == rc else same.get(key, first.get(r["prompt_id"]))
        if ref is None or ref is r:
            continue
        checked += 1
        diff = compare_outputs(ref, r)
        if diff is None:
            continue
        m = Mismatch(r["prompt_id"], r["config"], r["repeat"], r["concurrency"], *diff, r["key"], ref["key"])
        d = (divergences or {}).get(r["key"])
        if d is not None:
            m.margin_single, m.margin_batched = d.get("margin_single"), d.get("margin_batched")
        elif m.unit == "token" and "margins" in r and "margins" in ref:  # a server's logprobs
            m.margin_single, m.margin_batched = _at(ref["margins"], m.position), _at(r["margins"], m.position)
        out.append(m)
    return out, checked


def _answer(r: dict) -> str:
    """The answer's text, then its tool calls as name and arguments (parsed where they are JSON)."""
    calls = []
    for c in r.get("tool_calls") or []:
        try:
            args = json.loads(c.get("arguments") or "null")
        except json.JSONDecodeError:
            args = c.get("arguments")
        calls.append(json.dumps({"name": c.get("name"), "arguments": args}, sort_keys=True))
    return (r.get("text") or "") + "".join(calls)


def _whole(r: dict) -> bool:
    """The request's token texts cover its whole output."""
    return r.get("tokens") is not None and len(r["tokens"]) >= (r.get("emitted_tokens") or 0)


def _at(xs: list, i: int):
    return xs[i] if i < len(xs) else None
