"""Where a turn's prompt is computed, in milliseconds: the decoder D alone, or a prefiller P_i and then D.

A pure function of the request's shape, each worker's usable hit and load, and a deployment's rates. It
predicts, for every option, this request's TTFT and what the option does to the streams D is decoding, and
picks the option with the least TTFT among those that keep D's streams within the ITL objective:

    option          TTFT                                                  D's streams: each waits / longest gap
    D alone         wait_D + prefill(U_d, hit_d) + steps * k * s          prefill(U_d, hit_d) / step(k+1) + a chunk
    P_i, then D     wait_i + prefill(U_i, hit_i) + hop + READ(MB)         the tail / step(k+1) + the tail
                    + step(k+1) + the tail on D

    N                the prompt's tokens; a hit is the joint one (attention blocks AND a checkpoint there)
    U_d = N - hit_d  what D computes alone
    U_i              what P_i computes: up to `tail` tokens short of N (the last aligned boundary below N for a
                     hybrid model, one token for an attention-only one), past its own hit; D computes the tail
    MB               what D pulls: the KV of the tokens between its own hit and P's stop, plus one checkpoint
    prefill(U, C)    steps * step + U * (per_token + per_token_per_kctx * (C + U/2) / 1000): each computed
                     token attends over its context, C + U/2 on average; an engine step costs `step` whatever it
                     computes (on our H100 runs most of it: the eager prefill path is CPU-bound). P takes
                     the steps its chunk size needs; D alone one more for a hybrid model (align mode ends a step
                     at the last aligned boundary, then computes the rest: `local_steps`)
    step(k)          D's decode step with k streams: step_ms + step_ms_per_seq * (k - 1); s = step_ms_per_seq
    k                D's running + waiting streams
    wait             a worker's queue: its queued prompt tokens at the per-token rate (and, on P, a fixed step
                     per request in it)

The objective (`itl_slo_ms`): > 0, the least TTFT among the options whose longest gap on D's streams is within it
(none within it: the least gap, i.e. protect the streams); 0, the least total delay the option adds: its TTFT plus
the stall of each of D's k streams (what every request waiting on D pays). Ties go to D alone (no hop, no bytes).

The choice is monotone (tests/proxy/test_placement.py checks it with Hypothesis): a busier D, or a larger hit
on a prefiller, never moves a turn from a prefiller to D; a busier prefiller, or a larger hit on D, never moves it
from D to a prefiller; a worker that cannot serve is never an option. This holds for rates with non-negative terms
whose prefill costs at least what reading its KV costs (per_token >= kv_mb_per_token * read_ms_per_mb; on every
GPU we measured, by two orders of magnitude).

In the proxy (decider.py) the choice is D alone or remote; a remote turn's prefiller is then the prefill router's
pick, as with every policy (with kv_hit or queue_cost routing it is the option's P_i or one as warm).

Priors (PRIORS) come from our GPU results; `online_rates.OnlineRates` updates them from the proxy's own
observations. This module imports nothing of the proxy: the fleet simulator imports it as is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Rates:
    """One deployment's costs, in ms (and MB). Fitted: benchmarks/gpu/fit_placement_priors.py; online: OnlineRates."""

    prefill_step_ms: float  # an engine step that computes prompt tokens, whatever their number
    prefill_ms_per_token: float  # per computed (uncached) token
    prefill_ms_per_token_per_kctx: float  # per computed token per 1,000 tokens of context it attends over
    hop_ms: float  # the remote path's fixed cost: P's HTTP leg, D's scheduling of the pulled request, handshake
    read_ms_per_mb: float  # D's READ of P's blocks
    kv_mb_per_token: float  # KV bytes a pulled token carries (all attention layers)
    checkpoint_mb: float  # the recurrent state pulled with them (hybrid models; 0 for attention-only)
    step_ms: float  # a decode step of one stream
    step_ms_per_seq: float  # what each further stream in the batch adds to it
    chunk_tokens: int = 8192  # the engine's max_num_batched_tokens: prompt tokens one step computes at most

    def prefill_ms(self, tokens: int, context: int, steps: int | None = None) -> float:
        """An engine's time to compute `tokens` prompt tokens after `context` cached ones, in `steps` engine
        steps (default: as many as its chunk size needs)."""
        if tokens <= 0:
            return 0.0
        mean_context = max(context, 0) + tokens / 2
        n_steps = self.chunks(tokens) if steps is None else steps
        return self.prefill_step_ms * n_steps + tokens * (
            self.prefill_ms_per_token + self.prefill_ms_per_token_per_kctx * mean_context / 1000.0
        )

    def step(self, streams: float) -> float:
        """A decode step with `streams` in the batch."""
        return self.step_ms + self.step_ms_per_seq * max(streams - 1, 0.0)

    def chunks(self, tokens: int) -> int:
        return max(1, math.ceil(tokens / max(self.chunk_tokens, 1))) if tokens > 0 else 0


# Priors: one H100, vLLM 0.26, Qwen3-Next shapes (12 layers = 3 x (3 GDN + 1 attention), 544-token aligned block,
# eager prefill, CUDA graphs for decode), from `python3 benchmarks/gpu/fit_placement_priors.py` over the phase probes
# (every server's /metrics around one request) and agentic rows of benchmarks/results/2026-11-24-h100-qwen3next,
# -r3 and -r4 (49 prefills, 38 PD turns):
#   prefill_ms_per_token           the profiled GPU kernel time per prompt token (2026-11-25-h100-prefill-steps:
#                                  123 ms for 17,399 tokens); our prompts cannot tell it from the steps' noise
#   prefill_step_ms, _per_kctx     least squares (>= 0) over the prefills as the proxy sees them (P's HTTP call,
#                                  a colocated turn's TTFT): two steps each in align mode, 52 ms a step (the
#                                  eager path is CPU-bound: 2026-11-25-h100-prefill-steps); residual p50 22 ms
#   hop_ms                         median of PD turns' TTFT - P's call - READ - D's first step
#   read_ms_per_mb                 median of the decoders' transfer time / bytes over cuda_ipc
#   kv_mb_per_token, checkpoint_mb least squares over (tokens pulled, bytes) of our PD turns
#   step_ms, step_ms_per_seq       the clients' ITL p50 at c=1 (7.1 ms) and c=8 (8.6 ms) of the agentic rows
# Other shapes and machines differ: the online fit (online_rates.py) takes over from a deployment's first
# requests.
PRIORS = Rates(
    prefill_step_ms=52.0,
    prefill_ms_per_token=0.00707,
    prefill_ms_per_token_per_kctx=0.00039,
    hop_ms=24.4,
    read_ms_per_mb=0.048,
    kv_mb_per_token=0.0056,
    checkpoint_mb=22.5,
    step_ms=7.1,
    step_ms_per_seq=0.22,
    chunk_tokens=8192,
)


@dataclass(frozen=True)
class WorkerView:
    """What placement knows of one worker for this request."""

    name: str
    hit: int = 0  # the prompt's usable hit on it: attention blocks AND a checkpoint at that boundary (tokens)
    load: float = 0.0  # streams in its batch or waiting for one (running + waiting)
    queued_tokens: int = 0  # prompt tokens it still has to compute for requests ahead of this one
    can_serve: bool = True  # admitted: healthy, not terminating


@dataclass(frozen=True)
class Option:
    prefiller: str | None  # None: the decoder alone
    ttft_ms: float  # predicted TTFT of this request
    stall_ms: float  # the delay it adds to each of D's running streams
    gap_ms: float  # D's streams' longest inter-token gap while it runs
    cost_ms: float  # the objective with itl_slo_ms = 0: ttft + k * stall
    meets_itl: bool  # gap within itl_slo_ms (always, with no streams on D or no objective)
    prefill_tokens: int  # prompt tokens computed on the prefiller (0 alone)
    decoder_tokens: int  # prompt tokens computed on the decoder
    read_mb: float  # bytes D pulls


@dataclass(frozen=True)
class Placement:
    prefiller: str | None  # the chosen prefiller's name; None: the decoder alone
    reason: str  # local_fastest, local_itl_slo, remote_fastest, remote_itl_slo, remote_least_gap, local_only
    chosen: Option
    options: tuple[Option, ...]  # D alone first, then each prefiller that can serve

    @property
    def local(self) -> bool:
        return self.prefiller is None


def local_steps(prompt_tokens: int, hit: int, aligned_block: int, chunk_tokens: int) -> int:
    """Engine steps an engine takes to compute a prompt past `hit` by itself. vLLM's align mode (hybrid models)
    ends a step at the last aligned boundary at or below the prompt's end, so that the state there can be
    cached, and computes the rest in one more step (2026-11-25-h100-prefill-steps: 4,857 = 4,352 + 505)."""
    chunk = max(chunk_tokens, 1)
    if aligned_block <= 0:
        return max(1, math.ceil((prompt_tokens - hit) / chunk))
    boundary = (prompt_tokens // aligned_block) * aligned_block
    before = math.ceil((boundary - hit) / chunk) if boundary > hit else 0
    return max(1, before + (1 if prompt_tokens > max(boundary, hit) else 0))


def remote_tail(prompt_tokens: int, aligned_block: int) -> int:
    """Tokens D computes itself after a pull: P stops at the last aligned boundary below the prompt's end (a
    hybrid model, aligned_block > 0), or one token short (vLLM computes the last token on D)."""
    if prompt_tokens <= 1:
        return max(prompt_tokens, 0)
    if aligned_block <= 0:
        return 1
    return prompt_tokens - ((prompt_tokens - 1) // aligned_block) * aligned_block


def place(
    prompt_tokens: int,
    decoder: WorkerView,
    prefillers: Sequence[WorkerView],
    rates: Rates = PRIORS,
    *,
    itl_slo_ms: float = 0.0,
    aligned_block: int = 0,
) -> Placement:
    """The option for a `prompt_tokens` prompt whose decoder is `decoder` (see the module's docstring). Only
    prefillers that can serve are options; with none, D alone. Hits are clamped to [0, N - 1]."""
    if not decoder.can_serve:
        raise ValueError(f"decoder {decoder.name} cannot serve: pick another before placing")
    n = max(int(prompt_tokens), 1)
    k = max(decoder.load, 0.0)
    slo = max(itl_slo_ms, 0.0)
    local = _local(n, decoder, k, rates, slo, aligned_block)
    tail = remote_tail(n, aligned_block)
    remotes = [_remote(n, tail, decoder, p, k, rates, slo) for p in prefillers if p.can_serve]
    options = (local, *remotes)
    if not remotes:
        return Placement(None, "local_only", local, options)
    if slo <= 0:
        best = min(options, key=lambda o: o.cost_ms)  # the first of equals: D alone wins ties
        return Placement(best.prefiller, "local_fastest" if best is local else "remote_fastest", best, options)
    within = [o for o in options if o.meets_itl]
    if within:
        best = min(within, key=lambda o: o.ttft_ms)
        if best is local:
            return Placement(None, "local_fastest", best, options)
        return Placement(best.prefiller, "remote_fastest" if local.meets_itl else "remote_itl_slo", best, options)
    best = min(remotes, key=lambda o: (o.gap_ms, o.ttft_ms))  # a remote gap never exceeds D alone's
    return Placement(best.prefiller, "remote_least_gap", best, options)


def _local(n: int, d: WorkerView, k: float, rates: Rates, slo: float, aligned_block: int) -> Option:
    hit = min(max(d.hit, 0), n - 1)
    u = n - hit
    steps = local_steps(n, hit, aligned_block, rates.chunk_tokens)
    prefill = rates.prefill_ms(u, hit, steps)
    wait = d.queued_tokens * rates.prefill_ms_per_token if d.queued_tokens > 0 else 0.0
    ttft = wait + prefill + steps * rates.step_ms_per_seq * k  # D's streams decode in each of those steps
    # the costliest step is a full chunk at the prompt's end (the most context): an upper bound on any gap
    last = min(u, rates.chunk_tokens)
    gap = rates.step(k + 1) + rates.prefill_ms(last, n - last, 1)
    meets = k <= 0 or slo <= 0 or gap <= slo
    return Option(None, ttft, prefill, gap, ttft + k * prefill, meets, 0, u, 0.0)


def _remote(n: int, tail: int, d: WorkerView, p: WorkerView, k: float, rates: Rates, slo: float) -> Option:
    boundary = n - tail
    p_hit = min(max(p.hit, 0), boundary)
    u = max(boundary - p_hit, 1 if boundary > 0 else 0)  # P computes at least one token per call
    d_hit = min(max(d.hit, 0), n - 1)
    pulled = max(boundary - d_hit, 0)  # D keeps its own hit and pulls the rest up to the boundary
    on_d = n - max(boundary, d_hit)  # then computes what is left: the tail, or less where it holds more
    read_mb = pulled * rates.kv_mb_per_token + rates.checkpoint_mb  # P's state at the boundary crosses
    # P's queue: every request ahead costs a step and its tokens (queued_tokens: this proxy's; load: everyone's)
    wait = (p.queued_tokens * rates.prefill_ms_per_token if p.queued_tokens > 0 else 0.0) + max(
        p.load, 0.0
    ) * rates.prefill_step_ms
    tail_ms = on_d * rates.prefill_ms_per_token
    step = rates.step(k + 1)
    ttft = wait + rates.prefill_ms(u, p_hit) + rates.hop_ms + read_mb * rates.read_ms_per_mb + step + tail_ms
    gap = step + min(on_d, rates.chunk_tokens) * rates.prefill_ms_per_token
    meets = k <= 0 or slo <= 0 or gap <= slo
    return Option(p.name, ttft, tail_ms, gap, ttft + k * tail_ms, meets, u, on_d, read_mb)
