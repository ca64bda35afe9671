"""D's side of early decode, for the scheduler half: requests admitted before their prefiller answered wait here.

A request whose kv_transfer_params carry a transfer key (contract.AWAIT_PREFILL) instead of P's params asks
`verdict` each time vLLM's scheduler considers it: not yet (the scheduler skips it this step), or its outcome, which
is then in its params: P's (it loads as any PD request) or none (D computes the prompt; counted as a failed load).
Outcomes come from the params inbox, which `pump` drains once per engine step (waiting on it a little in a step
with nothing else to do, so that a delivery wakes the engine at once); P's params nobody will read go back to P
as loads that read nothing (P frees the blocks). The bookkeeping per key is awaiting.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from hybrid_pd.connector.awaiting import Awaiting, Verdict
from hybrid_pd.connector.contract import AWAIT_PREFILL, AWAIT_S
from hybrid_pd.connector.errors import ConnectorError
from hybrid_pd.connector.messages import PrefillOutcome, parse_remote_prefill
from hybrid_pd.connector.step import LoadJob, StepMeta

log = logging.getLogger("vllm." + __name__)  # under vLLM's configured logger
IDLE_AWAIT_S = 0.001  # a step with nothing to compute waits this long on the inbox when idle_wait_s is 0


class OutcomeSource(Protocol):
    """Where the proxy's deliveries come from (params_inbox.ParamsInbox)."""

    def drain(self, wait_s: float = 0.0) -> list[PrefillOutcome]:
        """Every outcome delivered so far, waiting up to `wait_s` for the first."""


class EarlyDecodes:
    def __init__(
        self, inbox: OutcomeSource | None, await_timeout_s: float, idle_wait_s: float, clock: Callable[[], float]
    ):
        self.inbox = inbox  # None: this decoder takes no early requests (it computes them at once)
        self.await_timeout_s, self.idle_wait_s, self._clock = await_timeout_s, idle_wait_s, clock
        self.waits = Awaiting(keep_s=await_timeout_s)

    def __len__(self) -> int:
        return len(self.waits)

    def verdict(self, request_id: str, params: dict, meta: StepMeta) -> bool:
        """False while the request waits for P's outcome; True once it has one, which is then in `params` (a wait
        that ends without P's params is named in `meta.failed_waits`)."""
        key = str(params[AWAIT_PREFILL])
        now = self._clock()
        if self.inbox is None:
            verdict = Verdict(None, "this decoder has no params inbox (HYBRID_PD_PARAMS_PORT)")
        else:
            self._collect(0.0, now)
            bound, own = params.get(AWAIT_S), self.await_timeout_s  # the proxy's bound, where it sent one, and ours
            if isinstance(bound, (int, float)) and not isinstance(bound, bool) and 0 < bound < own:
                own = float(bound)
            found = self.waits.ask(key, own, now)
            if found is None:
                return False
            verdict = found
        del params[AWAIT_PREFILL]
        params.pop(AWAIT_S, None)
        if verdict.params is not None:
            params.update(verdict.params)
        else:
            log.warning("request %s: no remote prefill (%s): computing the prompt", request_id, verdict.reason)
            meta.failed_waits.append(request_id)
        return True

    def abandon(self, params: dict) -> None:
        """The request finished (aborted) while it waited: P is told to free when P's params come."""
        self.waits.abandon(str(params[AWAIT_PREFILL]), self._clock())

    def pump(self, idle: bool, meta: StepMeta) -> None:
        """Once per step: take in the deliveries (waiting a little for one when the step has nothing else to do),
        and add a load that reads nothing (P frees the blocks) for each of P's params nobody will read."""
        if self.inbox is None:
            return
        self._collect((self.idle_wait_s or IDLE_AWAIT_S) if idle and len(self.waits) else 0.0, self._clock())
        self.waits.expire(self._clock())
        for params in self.waits.orphans:
            try:
                remote = parse_remote_prefill(params)
            except ConnectorError as e:
                log.warning("prefill params nobody waits for, unreadable: %s", e)
                continue
            reason = "no decode request waits for it"
            meta.loads.append(LoadJob(f"orphan-{remote.remote_request_id}", remote, None, reason))
        self.waits.orphans.clear()

    def _collect(self, wait_s: float, now: float) -> None:
        assert self.inbox is not None
        try:
            outcomes = self.inbox.drain(wait_s)
        except ConnectorError as e:
            log.warning("params inbox: %s", e)
            return
        for outcome in outcomes:
            self.waits.deliver(outcome, now)
