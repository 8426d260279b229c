"""`--num-draft-tokens auto` for the server: the planner (draftwise.planner) picks each request's
D every step from its acceptance so far and the target's measured forward cost at the step's
batch size, so speculation switches itself off where batching has made verification too dear."""
from __future__ import annotations

from draftwise.planner import Planner
from draftwise.scheduler import RequestState


class PlannedDraftLength:
    """The scheduler's choose_draft_len / after_round pair over one Planner. A request that fixes
    its own D (`num_draft_tokens`, or `speculation: false`) keeps it."""

    def __init__(self, planner: Planner):
        self.planner = planner

    def choose(self, st: RequestState, n_running: int) -> int:
        if st.req.num_draft_tokens is not None:
            return st.req.num_draft_tokens
        if st.policy is None:
            st.policy = [self.planner.new_request(st.req.max_tokens), None]
        req_plan = st.policy[0]
        req_plan.remaining = st.out.remaining
        st.policy[1] = plan = self.planner.plan(req_plan, n_running)
        return plan.d

    def after_round(self, st: RequestState, proposed: int, accepted: int, emitted: int) -> None:
        if st.policy is not None and st.policy[1] is not None:
            self.planner.commit(st.policy[0], st.policy[1], proposed, accepted, emitted)
            st.policy[1] = None


def planned_policy(runner, drafter, max_running: int) -> PlannedDraftLength:
    """A planner over the target's forward-cost curve at batch sizes up to max_running (measured
    once and cached, see draftwise.profile.cached_profile)."""
    from draftwise.build import make_planner

    sizes = tuple(b for b in (1, 2, 4, 8, 16, 32) if b <= max_running) or (1,)
    if max_running not in sizes:
        sizes += (max_running,)
    return PlannedDraftLength(make_planner(runner, drafter, max_draft=8, batch_sizes=sizes, online=False))
