"""D's early decodes (the proxy's --early-decode): requests admitted before their prefiller has answered.

A decode request whose kv_transfer_params carry a transfer key (contract.AWAIT_PREFILL) instead of P's params waits,
unscheduled, until the proxy delivers the outcome of P's call under that key (params_inbox.py): P's params (the
request then loads like any PD request) or P's failure (D computes the prompt itself). The outcome may arrive
before the request first reaches the scheduler (P faster than D's own HTTP path), so outcomes are kept by key
until asked for. A wait is bounded: past it D computes the prompt itself. P's params that arrive for a key nobody
will read (its wait given up, its request aborted, never asked for) become orphans, for which P is told to free.

    outcome first:   (none) --deliver--> arrived --ask--> verdict
    request first:   (none) --ask--> waiting --deliver--> arrived --ask--> verdict
    given up:        waiting --ask past the bound--> gone (verdict: compute) --deliver--> orphan
    aborted:         waiting --abandon--> gone --deliver--> orphan;   arrived --abandon--> orphan
    never asked:     arrived --expire after keep_s--> orphan
    twice:           the same P params again under a key (P pushed them, then the proxy delivered): taken once

Pure bookkeeping: the caller passes the time.
"""

from __future__ import annotations

import dataclasses

from hybrid_pd.connector.messages import PrefillOutcome


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A wait's end: `params` (P's kv_transfer_params) to load, or None: compute the prompt, because `reason`."""

    params: dict | None
    reason: str = ""


class Awaiting:
    def __init__(self, keep_s: float):
        self.keep_s = keep_s  # how long an outcome (or a given-up key) is kept for a request that may still ask
        self._waiting: dict[str, float] = {}  # key -> deadline of its request's wait
        self._arrived: dict[str, tuple[PrefillOutcome, float]] = {}  # key -> (outcome, kept until)
        self._gone: dict[str, float] = {}  # keys whose request stopped waiting -> remembered until
        self._delivered: dict[tuple[str, tuple], float] = {}  # (key, P params' identity) seen -> remembered until
        self.orphans: list[dict] = []  # P's params nobody will read: the caller tells P to free, then clears

    def __len__(self) -> int:
        """Requests waiting now."""
        return len(self._waiting)

    def deliver(self, outcome: PrefillOutcome, now: float) -> None:
        same = _identity(outcome.params)
        if same is not None:
            if (outcome.key, same) in self._delivered:
                return  # these params came under this key already: one read, or one release
            self._delivered[(outcome.key, same)] = now + self.keep_s
        if outcome.key in self._gone or outcome.key in self._arrived:  # another second for one key is a stray
            self._orphan(outcome)
            return
        self._arrived[outcome.key] = (outcome, now + self.keep_s)

    def ask(self, key: str, bound_s: float, now: float) -> Verdict | None:
        """The verdict for the request waiting under `key`, or None: not yet, ask again next step. The first ask
        starts its wait of `bound_s` seconds."""
        arrived = self._arrived.pop(key, None)
        if arrived is not None:
            self._waiting.pop(key, None)
            outcome = arrived[0]
            return Verdict(outcome.params, outcome.reason or ("" if outcome.params else "the prefill failed"))
        if key in self._gone:  # asked again after its verdict (vLLM re-asks a request it could not schedule)
            return Verdict(None, "its wait ended already")
        deadline = self._waiting.setdefault(key, now + bound_s)
        if now < deadline:
            return None
        del self._waiting[key]
        self._gone[key] = now + self.keep_s
        return Verdict(None, f"no prefill outcome within {bound_s:g} s")

    def abandon(self, key: str, now: float) -> None:
        """The request under `key` finished (aborted) before its verdict."""
        self._waiting.pop(key, None)
        arrived = self._arrived.pop(key, None)
        if arrived is not None:
            self._orphan(arrived[0])
        self._gone[key] = now + self.keep_s

    def expire(self, now: float) -> None:
        """Drop outcomes no request asked for within keep_s (P's params become orphans) and old given-up keys."""
        for key, (outcome, until) in list(self._arrived.items()):
            if now >= until:
                del self._arrived[key]
                self._orphan(outcome)
        for key, until in list(self._gone.items()):
            if now >= until:
                del self._gone[key]
        for seen, until in list(self._delivered.items()):
            if now >= until:
                del self._delivered[seen]

    def _orphan(self, outcome: PrefillOutcome) -> None:
        if outcome.params:
            self.orphans.append(outcome.params)


def _identity(params: dict | None) -> tuple | None:
    """Which prefill `params` name (P's engine and request), or None where they name none."""
    if not params or "remote_request_id" not in params:
        return None
    return (params.get("remote_engine_id"), params["remote_request_id"])
