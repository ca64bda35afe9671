"""One client request on its way through the PD flow (pd_flow.py), and the `mode` label it ends with."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from .http.request import Request
from .openai_api import OpenAIRequest
from .placement.cost_model import Placement
from .routing import RequestContext
from .workers import Worker

LOCAL_PREFILL, REMOTE_PREFILL, FALLBACK = "local_prefill", "remote_prefill", "fallback"  # the `mode` label


@dataclass(slots=True)
class Turn:
    """Everything one request carries between the flow's steps."""

    request: Request  # the client's HTTP request, answered through it
    body: OpenAIRequest  # its parsed body
    context: RequestContext  # what the routing policies read (session, token ids, hits per worker)
    headers: dict[str, str]  # what the workers get: X-Request-Id, authorization
    started: float  # time.perf_counter() when it arrived
    deadline: float  # the loop time by which every step has ended (--total-timeout)
    mode: str = LOCAL_PREFILL
    transfer_params: dict[str, Any] | None = None  # P's kv_transfer_params, handed to D
    prefill_hit: int | None = None  # P's own prefix hit (P's cached_tokens)
    decoder_hit: int | None = None  # D's own hit as the KV index sees it (remote prefill only)
    decoder: Worker | None = None  # the decoder picked first (P is told whether it knows P's handshake)
    decided: float = 0.0  # time.perf_counter() when the decision was taken (what placement predicts from)
    placement: Placement | None = None  # policy ours: the model's prediction
    diverged: bool = False  # remote, and it diverged from D's cache where D held attention blocks but no checkpoint
    streams: float = 0.0  # the decoder's streams when the decision was taken
    prefiller: Worker | None = None  # the prefiller that answered
    prefill_ms: float | None = None  # its call, as this proxy saw it
    prefill_alone: bool = False  # nothing else of this proxy's was on it meanwhile (its call times a prefill)
    decode_alone: bool = False  # D served it alone with nothing else on D until its first token (its TTFT times one)
    reported_hit: int | None = None  # D's own cached_tokens on a turn it served alone (its answer's usage)
    first_byte: float | None = None  # time.perf_counter() of the first streamed byte
    prefill_answered: float | None = None  # time.perf_counter() when P's answer (or failure) reached the proxy
    # --early-decode: the kv_transfer_params D's request carries while P computes (a transfer key), and the task
    # that calls P and delivers its outcome to D's params inbox
    early: dict[str, Any] | None = None
    prefill_task: asyncio.Task[None] | None = None
    handshake_to: Any = None  # early: the (D, P) pair to mark delivered once D answered (proxy/handshakes.py)
