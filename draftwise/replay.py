"""Replay the planner offline on a teacher-forced trace of one greedy request.

A trace (`benchmarks/replay_planner.py traces` writes them) holds, per output position t, the target's
token and top probability and the draft model's argmax and its own probability, all scored on the
target's output. Greedy acceptance of any round is then known: a draft started at t is accepted
up to the first position where the draft's argmax differs from the target's token (accepted tokens
are the target's, so the draft's context is the one it was scored in). The request runs as the
engine runs it for a draft model (decide -> draft with the early stop -> verify -> learn, the
draft model catching up on what it has not seen), with seconds from the planner's cost curves, so
a planner change is judged on a whole run's prompts in seconds, under the cost model (the bench
measures the cost model's own error).
"""
from __future__ import annotations

from collections import defaultdict

from draftwise.drafters.base import Proposal, common_prefix
from draftwise.planner import Planner, RoundRecord
from draftwise.policy import shadow_tree, tree_steps
from draftwise.sampling import SamplingParams

GREEDY = SamplingParams()


def replay(tr: dict, planner: Planner, fixed: int = 0, max_tokens: int = 128) -> tuple[float, dict]:
    """Seconds to emit the trace's tokens (target prefill included), and counts."""
    out, n, L0 = tr["tokens"], len(tr["tokens"]), tr["prompt_tokens"]
    secs = planner.target.raw(L0)
    t, fed = 1, 0  # tokens emitted (the first by the prefill); context tokens in the draft KV
    req = planner.new_request(max_tokens - 1) if not fixed else None  # as the engine's
    c = defaultdict(int)
    while t < n:
        L, room = L0 + t, n - t - 1
        unseen = L - fed
        if req is not None:
            dec = planner.decide(req, available=room, unseen=unseen)
            d, stop = dec.d, dec.stop
        else:
            d, stop, dec = min(fixed, room), None, None
        toks, confs, forwards, stop_conf, dropped = [], [], 0, None, False
        for i in range(d):
            conf = tr["draft_top"][t + i]
            forwards += 1
            if stop is not None and stop.drops(i, conf):
                stop_conf, dropped = conf, True
                break
            toks.append(tr["draft_argmax"][t + i])
            confs.append(conf)
            if len(toks) < d and stop is not None and stop.ends_at(i, conf):
                stop_conf = conf
                break
        a = common_prefix(toks, out[t:])
        draft_s = planner.draft.raw(unseen) + (forwards - 1) * planner.draft.raw(1) if forwards else 0.0
        round_s = draft_s + planner.target.raw(len(toks) + 1)
        emitted = min(a + 1, n - t)
        if forwards:
            fed = L + min(a, len(toks) - (0 if dropped else 1))
        if req is not None:
            top = tr["target_top"][t:t + max(min(a + 1, len(toks)), 1)]
            planner.learn(req, dec, RoundRecord(len(toks), a, emitted, confs if stop else None, stop_conf, round_s, top))
        secs += round_s
        c["rounds" if toks else "plain"] += 1
        c["proposed"] += len(toks)
        c["accepted"] += a
        c["catch_up"] += unseen > 2 and forwards > 0  # more than a fully accepted round leaves
        t += emitted
    if req is not None:
        planner.finish(req, n - 1)
    return secs, dict(c)


def replay_cheap(tr: dict, planner: Planner, drafter, fixed: int = 0, max_tokens: int = 128,
                 key: int = 0, oracle: bool = False) -> tuple[float, dict]:
    """replay() for a drafter with no model (n-gram, suffix, suffix-tree; needs the trace's
    prompt_ids): its proposal is a function of the context (and, for suffix, of the requests
    released before), so each step proposes as the engine does (up to max_draft, the planner then
    choosing how many to verify, a tree's nodes priced as the engine's policy prices them and
    accepted along the branch that follows the target's tokens; its unverified first token, or a
    tree's first-level nodes, a shadow at a plain step). The request is released at the
    end under `key`, so a suffix drafter's global trie carries it to the next trace. `oracle`: each
    round verifies exactly the proposed tokens the target accepts (none: a plain step), the most
    any sizing of these proposals could gain."""
    out, n, L0 = tr["tokens"], len(tr["tokens"]), tr["prompt_tokens"]
    ctx = tr["prompt_ids"] + out
    secs, t, c = planner.target.raw(L0), 1, defaultdict(int)
    req = planner.new_request(max_tokens - 1) if not fixed and not oracle else None
    while t < n:
        room = n - t - 1
        want = min(fixed, room) if fixed else min(planner.max_draft, room)
        prop = drafter.propose(key, ctx[:L0 + t], want, GREEDY, None)
        tree = prop.parents is not None and bool(prop.tokens)
        dec = None
        if req is not None:  # a tree's nodes priced as the engine's policy prices them
            node_p = planner.node_chances(req, prop.parents, tree_steps(prop)) if tree else None
            dec = planner.decide(req, available=len(prop.tokens), node_p=node_p)
        sub = prop.first(dec.d if dec is not None else len(prop.tokens))
        path = _path(sub, out, t)
        a = len(path)
        if oracle:
            sub = prop.first(0) if not path else Proposal([prop.tokens[i] for i in path])
        toks = sub.tokens
        emitted = min(a + 1, n - t)
        round_s = planner.draft_call_s + planner.target.raw(len(toks) + 1)  # it proposes every step
        if req is not None and tree and toks:
            planner.learn(req, dec, RoundRecord(len(toks), a, emitted, tree_steps(sub), seconds=round_s, path=path,
                                                 parents=sub.parents))
        elif req is not None:
            conf = prop.confidence[:len(toks)] if prop.confidence and toks else None
            planner.learn(req, dec, RoundRecord(len(toks), a, emitted, conf, seconds=round_s))
        if req is not None and prop.tokens and not toks:  # the unverified first token(s) against the plain step's
            planner.shadow(req, float(prop.tokens[0] == out[t]))
            if tree:
                shadow_tree(planner, req, prop, lambda x: float(x == out[t]))
        secs += round_s
        c["rounds" if toks else "plain"] += 1
        c["proposed"] += len(toks)
        c["accepted"] += a
        t += emitted
    drafter.release(key, ctx)  # the whole output, as the engine releases it
    if req is not None:
        planner.finish(req, n - 1)
    return secs, dict(c)


def _path(prop: Proposal, out: list[int], t: int) -> list[int]:
    """Greedy acceptance of a proposal, a chain or a candidate tree (parents before children,
    siblings distinct): the nodes on the target's tokens from position t on."""
    parents = prop.parents if prop.parents is not None else list(range(-1, len(prop.tokens) - 1))
    path, at = [], -1
    for i, (q, tok) in enumerate(zip(parents, prop.tokens)):
        if q == at and t + len(path) < len(out) and tok == out[t + len(path)]:
            path.append(i)
            at = i
    return path
