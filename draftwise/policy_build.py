"""A draft-length policy from a D setting (an integer, or "auto"), over the measured forward-cost
curves of the target and the draft model (profiled once per machine and cached)."""
from __future__ import annotations

import sys

from draftwise.costs import CostCurve
from draftwise.draft_length import MAX_DRAFT_CHEAP, MAX_DRAFT_MODEL, config_for
from draftwise.drafters.auto import AutoDrafter
from draftwise.drafters.base import Drafter
from draftwise.planner import Planner
from draftwise.prediction_policy import PredictionRouting
from draftwise.choice import DrafterChoice
from draftwise.policy import DraftPolicy, FixedDraftLength, PlannedDraftLength


def default_max_draft(drafter: Drafter) -> int:
    return MAX_DRAFT_CHEAP if drafter.cheap else MAX_DRAFT_MODEL


def _log(log):
    return log or (lambda m: print(m, file=sys.stderr))


def target_profile(runner, max_draft: int, batch_sizes=(1,), log=None) -> CostCurve:
    """The target's cost curve over k = 1..max_draft + 1 (at least 1..17). At several batch sizes
    (the server) only k = 1..17, which keeps the first start's profiling short; past it the curve
    extrapolates."""
    from draftwise.profile import cached_profile

    ks = range(1, (max(max_draft, 16) if tuple(batch_sizes) == (1,) else 16) + 2)
    return CostCurve.from_profile(cached_profile(runner, batch_sizes, ks, log=_log(log)))


def make_planner(runner, drafter: Drafter, max_draft: int | None = None, batch_sizes=(1,), log=None,
                 target: CostCurve | None = None, **settings) -> Planner:
    """A planner on the target's curve (`target`: already loaded, planners sharing it) and, for a
    draft model, its own; settings override the drafter's PlannerConfig."""
    from draftwise.profile import cached_profile

    max_draft = max_draft or default_max_draft(drafter)
    target = target or target_profile(runner, max_draft, batch_sizes, log)
    draft = None
    if not drafter.cheap:
        draft = CostCurve.from_profile(cached_profile(drafter.runner, (1,), range(1, 18), log=_log(log)))
    config = config_for(drafter.name, drafter.cheap, max_draft)
    return Planner(target, draft, config, **settings)


def make_policy(num_draft_tokens: int | str, runner, drafter: Drafter | None, batch_sizes=(1,),
                off_above: int | None = None, planner: Planner | None = None) -> DraftPolicy:
    """"auto" (with a drafter) plans, an integer is fixed; no drafter means plain decoding."""
    if drafter is None:
        return FixedDraftLength(0)
    if num_draft_tokens == "auto" and isinstance(drafter, AutoDrafter) and drafter.base is not None:
        alone = drafter.members[drafter.base]  # a configured drafter composed with the prediction
        return PredictionRouting(PlannedDraftLength(planner or make_planner(runner, alone, batch_sizes=batch_sizes)),
                                 make_choice(runner, drafter, batch_sizes=batch_sizes), drafter.base)
    if num_draft_tokens == "auto" and drafter.name == "auto":
        return make_choice(runner, drafter, batch_sizes=batch_sizes)
    if num_draft_tokens == "auto":
        return PlannedDraftLength(planner or make_planner(runner, drafter, batch_sizes=batch_sizes))
    return FixedDraftLength(num_draft_tokens, off_above)


def make_choice(runner, drafter, batch_sizes=(1,), log=None) -> DrafterChoice:
    """One planner per member of a --drafter auto, on the target's one measured curve."""
    members = drafter.members
    target = target_profile(runner, max(default_max_draft(m) for m in members.values()), batch_sizes, log)
    planners = {name: make_planner(runner, member, batch_sizes=batch_sizes, log=log, target=target)
                for name, member in members.items()}
    return DrafterChoice(planners, drafter.modelled)
