"""One role's routing: weighted scorers, then the picker, over the admitted workers."""

from __future__ import annotations

from collections.abc import Sequence

from ..config.sections import Policy
from ..errors import NoHealthyWorker
from ..workers import Worker
from .base import Deps, RequestContext
from .registry import PICKERS, SCORERS


class Router:
    def __init__(self, role: str, policy: Policy, deps: Deps):
        self.role = role
        self.policy = policy
        self.scorers = [(SCORERS[name](deps), weight) for name, weight in policy.scorers]
        self.picker = PICKERS[policy.picker](deps)
        self.total_weight = sum(weight for _, weight in policy.scorers) or 1.0
        self.label = ",".join(name for name, _ in policy.scorers) + "/" + policy.picker  # metrics label

    def scores(self, ctx: RequestContext, workers: Sequence[Worker]) -> list[float]:
        total = [0.0] * len(workers)
        for scorer, weight in self.scorers:
            total = [t + weight * min(1.0, max(0.0, s)) for t, s in zip(total, scorer.score(ctx, workers))]
        return [t / self.total_weight for t in total]

    def pick(self, ctx: RequestContext, workers: Sequence[Worker]) -> Worker:
        if not workers:
            raise NoHealthyWorker(f"no healthy {self.role} worker is admitted")
        if len(workers) == 1:
            return workers[0]  # no score can change the pick (the flow asks kv_hit for D's hit itself)
        return self.picker.pick(ctx, workers, self.scores(ctx, workers))
