"""A configured cheap drafter composed with requests' predictions (draftwise.build.with_prediction):
which policy drafts each request.

    a request without a prediction   `alone`: the configured drafter's own policy, over that
                                     drafter alone, exactly as uncomposed
    a request with one               `choice`: the --drafter auto policy over the configured
                                     drafter and the prediction, one planner each, which sizes
                                     the prediction's drafts like any member's (and may take the
                                     configured drafter's where the output leaves the prediction)

Both are driven through the same calls as every policy (draftwise.policy); a step's requests are
split by kind, each group drafted by its policy, the drafts merged back in order.
NOTE: a step mixing both kinds prices each group's drafts as if the group ran alone.
"""
from __future__ import annotations

from dataclasses import replace

from draftwise.policy import DraftPolicy, RoundOutcome, StepTimes
from draftwise.proposing import Drafting, Drafts


class PredictionRouting(DraftPolicy):
    def __init__(self, alone: DraftPolicy, choice: DraftPolicy, base: str):
        self.alone, self.choice, self.base = alone, choice, base  # base: the configured drafter's member name
        self.max_draft = max(alone.max_draft, choice.max_draft)

    def _of(self, st) -> DraftPolicy:
        return self.choice if st.req.prediction else self.alone

    def begin(self, st) -> None:
        self._of(st).begin(st)

    def draft(self, batch: list, drafting: Drafting) -> Drafts:
        predicted = [i for i, st in enumerate(batch) if st.req.prediction]
        if not predicted:  # the configured drafter alone, as uncomposed
            return self.alone.draft(batch, replace(drafting, drafter=drafting.drafter.members[self.base]))
        if len(predicted) == len(batch):
            return self.choice.draft(batch, drafting)
        rest = [i for i, st in enumerate(batch) if not st.req.prediction]
        items: list = [None] * len(batch)
        for idx, drafts in ((rest, self.draft([batch[i] for i in rest], drafting)),
                            (predicted, self.choice.draft([batch[i] for i in predicted], drafting))):
            for i, item in zip(idx, drafts.items):
                items[i] = item
        return Drafts(items)

    def accept(self, st, outcome: RoundOutcome) -> None:
        self._of(st).accept(st, outcome)

    def end(self, st) -> None:
        self._of(st).end(st)

    def observe(self, times: StepTimes) -> None:
        self.alone.observe(times)  # each keeps its own view of the target's cost curve
        self.choice.observe(times)
