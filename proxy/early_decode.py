"""--early-decode's steps of one PD turn (pd_flow.py runs them where the turn is remote and D has a params inbox):
P's call and D's request start together.

D gets the body with a transfer key (contract.AWAIT_PREFILL) in place of P's params, and a bound (AWAIT_S) on its
wait; it admits and tokenizes the request while P computes, and waits until P's outcome reaches its params inbox
under that key (params_outbox.py): P's params (P's handshakes left out where D has them), or the reason D computes
the prompt itself. D's answer is the client's, whatever P did: exactly one answer. P's 4xx does not reach the
client: D, validating the same body, answers for itself.

    delivered:        D's answer, after reading P's blocks (or computing the prompt where P failed); P's params
                      reach D's inbox from P itself where P could push them (connector/direct_delivery.py: P's
                      answer says so), else from the proxy
    not delivered:    D's early request withdrawn (its connection closed: vLLM aborts it), then the turn to D in
                      turn, as without --early-decode: P's params with the request, or D alone where P failed
    D not reached:    the decode step's retry on another decoder, in turn; nothing is delivered
    D gave up first:  (its bound ran out: only past P's timeout + EARLY_WAIT_MARGIN_S) D computes the prompt and
                      answers; P's params delivered late are D's to hand back to P (connector/awaiting.py: orphans)

The flow's own steps (P's call, D's call and its retry on another decoder, the fallback) stay pd_flow.py's; this
module reaches them through `Steps`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from typing import Protocol

from hybrid_pd.connector.contract import AWAIT_PREFILL, AWAIT_S, DELIVERED

from .errors import UpstreamStatus
from .handshakes import HandshakeMemo
from .metrics import FlowRecorder
from .params_outbox import ParamsOutbox
from .timers import time_left
from .turn import REMOTE_PREFILL, Turn
from .workers import Worker

log = logging.getLogger("hybrid_pd.proxy")
# Transfer keys: unique across proxies and restarts (one decoder's inbox hears from every proxy), and not the
# request id: a client may send one id twice at once.
_KEY_PREFIX = f"pd-{os.urandom(8).hex()}-early-"
_keys = itertools.count(1)

# D waits for P's outcome this much longer than the proxy waits for P (the delivery's own way)
EARLY_WAIT_MARGIN_S = 5.0


class Steps(Protocol):
    """The flow's steps an early turn runs (pd_flow.PDFlow)."""

    async def prefill_step(self, turn: Turn, decoder: Worker) -> None:
        """P's call: sets the turn's transfer_params, or falls back (4xx raised; TimeoutError at the deadline)."""

    async def decode(self, turn: Turn, decoder: Worker) -> None:
        """D's call, its answer relayed to the client (another decoder's where D cannot be reached)."""

    def fallback(self, turn: Turn, reason: str) -> None:
        """The turn goes without P's params (D computes the prompt), counted under `reason`."""


class EarlyDecode:
    def __init__(self, steps: Steps, handshakes: HandshakeMemo, record: FlowRecorder, prefill_s: float):
        self.steps, self.handshakes, self.record, self.prefill_s = steps, handshakes, record, prefill_s
        self.outbox = ParamsOutbox()  # P's outcomes to the decoders' params inboxes

    async def serve(self, turn: Turn, decoder: Worker, loop: asyncio.AbstractEventLoop) -> None:
        """P's call and D's request at once; returns once the client's one answer was relayed and P's call ended."""
        assert decoder.inbox is not None
        key = f"{_KEY_PREFIX}{next(_keys)}"
        bound = min(self.prefill_s, time_left(loop, turn.deadline)) + EARLY_WAIT_MARGIN_S
        turn.early = {AWAIT_PREFILL: key, AWAIT_S: round(bound, 3)}
        turn.mode = REMOTE_PREFILL
        self.outbox.connect(decoder.inbox)  # connected by the time P answers
        current = asyncio.current_task(loop)
        assert current is not None
        cancelling = current.cancelling()
        attempt = loop.create_task(self.steps.decode(turn, decoder))  # D's early request, its answer relayed
        task = turn.prefill_task = loop.create_task(self._prefill_and_deliver(turn, decoder, key, attempt))
        try:
            try:
                await attempt
            except asyncio.CancelledError:
                if not attempt.cancelled() or current.cancelling() > cancelling:  # the client left, the proxy stops
                    raise
                await self.steps.decode(turn, decoder)  # withdrawn (_withdraw): the turn goes to D in turn
            await task  # done already unless D answered without it (an error); bounded by P's timeout
        finally:
            if not attempt.done():
                attempt.cancel()
            if not task.done():  # the client left, or the deadline passed: P's call is left behind (its lease frees)
                task.cancel()

    def close(self) -> None:
        self.outbox.close()

    async def _prefill_and_deliver(self, turn: Turn, decoder: Worker, key: str, attempt: asyncio.Task[None]) -> None:
        """P's call, then its outcome to D's params inbox. Nothing raises out of here: D waits for the delivery."""
        assert decoder.inbox is not None
        try:
            await self.steps.prefill_step(turn, decoder)
            reason = "" if turn.transfer_params is not None else "prefill fell back"
        except UpstreamStatus as e:  # P's 4xx: D, validating the same body, answers the client itself
            turn.prefill_answered, reason = time.perf_counter(), f"prefill_{e.status}"
            self.steps.fallback(turn, reason)
        except TimeoutError:
            turn.prefill_answered, reason = time.perf_counter(), "total deadline"
            self.steps.fallback(turn, reason)
        except Exception:  # noqa: BLE001  the top of this task: D must hear, or it waits out its bound
            log.exception("early decode %s: the prefill step failed", key)
            turn.prefill_answered, reason = time.perf_counter(), "internal"
            turn.transfer_params = None
            self.steps.fallback(turn, reason)
        if turn.early is None:  # D could not be reached: the decode step took the turn to another decoder, in turn
            return
        params = turn.transfer_params
        if params is not None:
            params, turn.handshake_to = self.handshakes.params_for(params, decoder.url, decoder.identity)
            if params.get(DELIVERED):  # P pushed them to D's inbox itself (connector/direct_delivery.py)
                self.record.delivered("prefiller")
                return
        if not await self.outbox.deliver(decoder.inbox, key, params, reason) and turn.early is not None:
            self._withdraw(turn, attempt)
            return
        self.record.delivered("proxy")

    def _withdraw(self, turn: Turn, attempt: asyncio.Task[None]) -> None:
        """The delivery failed (nothing was sent): D would wait out its whole bound. Its early request is withdrawn
        while nothing reached the client: its connection closed, vLLM aborts it and frees its blocks, and D's
        connector forgets the key. serve() then sends the turn to D in turn, with P's params where P gave them.
        A D that is really gone fails that call too, and the decode step's own retry takes the turn to another
        decoder, or answers the client an error."""
        self.record.error("early_undelivered")
        if attempt.done() or turn.request.started:  # D answered already, or answers without P (its wait ended)
            if turn.transfer_params is not None:
                turn.transfer_params = None
                self.steps.fallback(turn, "delivery_failed")
            return
        turn.early = turn.handshake_to = None
        attempt.cancel()
