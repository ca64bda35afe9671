"""The placement model's rates, kept up to date from the proxy's own requests (cost_model.py holds the model).

Three fits, each starting from the priors (cost_model.PRIORS, or a deployment's own) and moving with what the
proxy sees of its requests, recent ones weighing more (forgetting factor `forget` per observation):

    prefill   recursive least squares over (engine steps, computed tokens, their mean context) -> ms, from
              P's calls (P's duration; P's own reported hit) and from turns D served alone (their TTFT, less
              what D's streams added to its steps; D's reported hit where its answer carries it)
    hop       an average of what a PD turn's TTFT has beyond P's call, D's first step, the READ and the tail
    step      recursive least squares over (streams on D) -> the turn's mean inter-token time

An observation more than `outlier` times its prediction either way (a first-shape compile, a stall) is clamped
there, so one cannot drag a fit far. The snapshot (`rates`) keeps every term >= 0 and the per-token prefill rate
at least the READ's per token: the premises of the model's monotone choice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from .cost_model import PRIORS, Rates


class RLS:
    """Recursive least squares with exponential forgetting, started from a prior: `theta` are the coefficients of
    the features (in their own units); `scale` the prior's spread per coefficient (how far a few observations may
    move it)."""

    __slots__ = ("theta", "p", "forget", "cap", "n")

    def __init__(self, theta: Sequence[float], scale: Sequence[float], forget: float):
        self.theta = list(theta)
        k = len(self.theta)
        self.p = [[(scale[i] ** 2 if i == j else 0.0) for j in range(k)] for i in range(k)]
        self.cap = [scale[i] ** 2 for i in range(k)]  # the spread never grows past the prior's (no wind-up)
        self.forget = forget
        self.n = 0

    def predict(self, x: Sequence[float]) -> float:
        return sum(t * v for t, v in zip(self.theta, x))

    def update(self, x: Sequence[float], y: float) -> None:
        k = len(self.theta)
        px = [sum(self.p[i][j] * x[j] for j in range(k)) for i in range(k)]
        denom = self.forget + sum(x[i] * px[i] for i in range(k))
        if denom <= 0:
            return
        gain = [v / denom for v in px]
        err = y - self.predict(x)
        self.theta = [t + g * err for t, g in zip(self.theta, gain)]
        self.p = [[(self.p[i][j] - gain[i] * px[j]) / self.forget for j in range(k)] for i in range(k)]
        for i in range(k):
            if self.p[i][i] > self.cap[i]:
                f = (self.cap[i] / self.p[i][i]) ** 0.5
                for j in range(k):
                    self.p[i][j] *= f
                    self.p[j][i] *= f
        self.n += 1


class OnlineRates:
    """Rates for cost_model.place, from priors and the proxy's observations (one event loop: no locks)."""

    def __init__(self, prior: Rates = PRIORS, forget: float = 0.98, outlier: float = 4.0, hop_alpha: float = 0.1):
        self.prior = prior
        self.outlier = outlier
        self.hop_alpha = hop_alpha
        # prefill features: [steps, tokens / 1000, tokens * mean context / 1e6] -> ms
        p = prior
        self._prefill = RLS(
            [p.prefill_step_ms, p.prefill_ms_per_token * 1000, p.prefill_ms_per_token_per_kctx * 1000],
            [max(p.prefill_step_ms, 10.0), max(p.prefill_ms_per_token * 1000, 5.0), 1.0],
            forget,
        )
        # decode step features: [1, streams - 1] -> ms
        self._step = RLS([p.step_ms, p.step_ms_per_seq], [max(p.step_ms, 5.0), 1.0], forget)
        self._hop = p.hop_ms
        self.observations = {"prefill": 0, "hop": 0, "step": 0}
        self._rates: Rates | None = prior

    # ---- observations -------------------------------------------------------------------------------------
    def observe_prefill(self, tokens: int, context: int, steps: int, ms: float) -> None:
        """An engine computed `tokens` prompt tokens after `context` cached ones in `steps` steps: `ms`, as the
        proxy saw it (one HTTP call around it)."""
        if tokens <= 0 or steps <= 0 or ms <= 0:
            return
        x = [float(steps), tokens / 1000.0, tokens * (max(context, 0) + tokens / 2) / 1e6]
        self._prefill.update(x, self._clamp(ms, self._prefill.predict(x)))
        self.observations["prefill"] += 1
        self._rates = None

    def observe_hop(self, ms: float) -> None:
        """What a PD turn's TTFT had beyond P's call, the READ, D's first step and the tail."""
        ms = self._clamp(ms, self._hop) if self._hop > 0 else ms
        self._hop = max(0.0, (1 - self.hop_alpha) * self._hop + self.hop_alpha * ms)
        self.observations["hop"] += 1
        self._rates = None

    def observe_step(self, streams: float, ms: float) -> None:
        """A turn's mean inter-token time while D had `streams` streams (itself included)."""
        if ms <= 0:
            return
        x = [1.0, max(streams - 1, 0.0)]
        self._step.update(x, self._clamp(ms, self._step.predict(x)))
        self.observations["step"] += 1
        self._rates = None

    def _clamp(self, y: float, predicted: float) -> float:
        if predicted <= 0:
            return y
        return min(max(y, predicted / self.outlier), predicted * self.outlier)

    # ---- the snapshot -------------------------------------------------------------------------------------
    @property
    def rates(self) -> Rates:
        if self._rates is None:
            step_ms, per_token_k, per_kctx_k = (max(v, 0.0) for v in self._prefill.theta)
            read_per_token = self.prior.kv_mb_per_token * self.prior.read_ms_per_mb
            self._rates = dataclasses.replace(
                self.prior,
                prefill_step_ms=step_ms,
                prefill_ms_per_token=max(per_token_k / 1000.0, read_per_token),
                prefill_ms_per_token_per_kctx=per_kctx_k / 1000.0,
                hop_ms=self._hop,
                step_ms=max(self._step.theta[0], 0.0),
                step_ms_per_seq=max(self._step.theta[1], 0.0),
            )
        return self._rates

    def as_dict(self) -> dict[str, float]:
        r = self.rates
        return {f.name: float(getattr(r, f.name)) for f in dataclasses.fields(r)}
