"""`--num-draft-tokens auto` for the server: the planner (draftwise.planner) picks each request's
D every step from its acceptance so far and the target's measured forward cost at the step's
batch size, so speculation switches itself off where batching has made verification too dear.
As in the engine, a draft model's catch-up after plain steps is priced (`behind`) and its draft
stops early by the plan's StopRule. The server's planner is not rescaled by measured times
(online=False), so what it chooses is a function of the tokens (and the draft's probabilities)."""
from __future__ import annotations

from draftwise.drafters.base import Drafter, StopRule
from draftwise.planner import Planner
from draftwise.scheduler import RequestState


class PlannedDraftLength:
    """The scheduler's choose_draft_len / after_round pair over one Planner. A request that fixes
    its own D (`num_draft_tokens`, or `speculation: false`) keeps it."""

    def __init__(self, planner: Planner, drafter: Drafter | None = None):
        self.planner = planner
        self.draft_model = drafter if drafter is not None and not drafter.cheap else None  # catch-ups to price

    def choose(self, st: RequestState, n_running: int) -> int:
        if st.req.num_draft_tokens is not None:
            return st.req.num_draft_tokens
        if st.policy is None:
            st.policy = [self.planner.new_request(st.req.max_tokens), None]
        req_plan = st.policy[0]
        req_plan.remaining = st.out.remaining
        behind = self.draft_model.pending(st.key, st.ctx) if self.draft_model is not None else 1
        st.policy[1] = plan = self.planner.plan(req_plan, n_running, behind=behind)
        plan.behind = behind
        return plan.d

    def stop(self, st: RequestState) -> StopRule | None:
        return st.policy[1].stop if st.policy is not None and st.policy[1] is not None else None

    def after_round(self, st: RequestState, proposed: int, accepted: int, emitted: int,
                    confidence: list[float] | None = None, stop_confidence: float | None = None,
                    target_top=None) -> None:
        """`target_top`: a callable for the target's top probabilities (draftwise.sampling.target_top),
        computed only for a draft model (an n-gram's shadow is its own proposal)."""
        if st.policy is not None and st.policy[1] is not None:
            top = target_top() if target_top is not None and self.draft_model is not None else None
            self.planner.commit(st.policy[0], st.policy[1], proposed, accepted, emitted, confidence,
                                stop_confidence, target_top=top)
            st.policy[1] = None

    def hooks(self) -> dict:
        """The Scheduler's keyword arguments for this policy."""
        return {"choose_draft_len": self.choose, "after_round": self.after_round, "draft_stop": self.stop}


def planned_policy(runner, drafter, max_running: int) -> PlannedDraftLength:
    """A planner over the target's forward-cost curve at batch sizes up to max_running (measured
    once and cached, see draftwise.profile.cached_profile)."""
    from draftwise.build import make_planner

    sizes = tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= max_running) or (1,)
    if max_running not in sizes:
        sizes += (max_running,)
    return PlannedDraftLength(make_planner(runner, drafter, max_draft=8, batch_sizes=sizes, online=False), drafter)
