"""Where a turn's prompt is computed, in milliseconds: the decoder D alone, or a prefiller P_i and then D.

A pure function of the request's shape, each worker's usable hit and load, and a deployment's rates. It
predicts, for every option, this request's TTFT and what the option does to the streams D is decoding, and
picks the option with the least TTFT among those that keep D's streams within the ITL objective:

    option              TTFT                                                    D's streams: each waits / gap
    D alone             wait_D + prefill(U_d, hit_d) + steps * k * s            prefill(U_d, hit_d)
    P_i to the boundary max(f * (wait_i + prefill(U_i, hit_i)) + hop + READ(MB), the tail's step
                        wait_D) + step(k+1) + the tail's step on D
    P_i to N-1          max(f * (wait_i + prefill(U_i', hit_i)) + hop     s (one more sequence's token)
                        + READ(MB'), wait_D) + step(k+1)

    N                the prompt's tokens; a hit is the joint one (attention blocks AND a checkpoint there)
    U_d = N - hit_d  what D computes alone
    U_i              what P_i computes to the boundary: the last aligned boundary below N (a hybrid model), past
                     its own hit, in the steps its chunk size needs; D then computes the tail (< one aligned
                     block) in an engine step of its own: a mixed step whose fixed cost every running stream
                     waits for (2026-11-26 H200 run: 37 ms where a decode step took 6.6)
    U_i'             what P_i computes to N-1 (as upstream's connector does; the only option of an attention-only
                     model), and D's last token rides in a decode step (vLLM 0.33, H100: 10-12 ms against 56-77
                     for the tail's step; TTFT p50 177 against 267 ms: 2026-11-27-h100x4-qwen3next-c1-tax-vllm033).
                     Chosen per turn: P's stop travels in its kv_transfer_params (connector/contract.py PREFILL_STOP)
    MB               what D pulls: the KV of the tokens between its own hit and P's stop, plus the state at P's
                     stop, plus at N-1 the aligned checkpoint below it (P ships it for D to keep: `pulled_mb`)
    prefill(U, C)    steps * step + U * (per_token + per_token_per_kctx * (C + U/2) / 1000): each computed
                     token attends over its context, C + U/2 on average; an engine step costs `step` whatever it
                     computes (CPU-bound launch work on our GPU runs). With `align_split` (an engine whose kernels
                     declare no prefill checkpoints) D alone and P, at either stop, take a step more than their
                     chunks (`local_steps`); where they declare them, the state is written inside the last chunk
    step(k)          D's decode step with k streams: step_ms + step_ms_per_seq * (k - 1); s = step_ms_per_seq
    k                D's running + waiting streams
    f                P's call as measured over P's call as priced (`prefiller_call_factor`, 1 in the priors): what
                     a loaded P costs beyond its queue's steps and tokens (a GPU it shares with D, a batch whose
                     requests all finish at its last step); learned from every remote turn (online_rates.py)
    wait             a prefiller's queue: the steps and tokens of the prompt tokens queued on it (an engine step
                     batches several requests' chunks, up to chunk_tokens), one step where it runs requests this
                     proxy did not send; D's (wait_D): its queued prompt tokens, which ride in its own steps, and
                     which a pulled turn's first step on D waits for where they outlast P's part

On a shared device (P and D on one GPU, as on our one-GPU runs) P's prefill takes the GPU from D's streams: a
remote option stalls each of them for s times P's prefill (its compute, not its queue) plus the tail, its longest
gap holds s times P's costliest step, and D's steps slow P's (s = `shared_device` in [0, 1], --shared-device-stall).
Measured: 2026-11-26-h100-qwen3next-judged-vllm033 at c=8, where the model without it sent 29 of 40 turns to P,
each computing more than D alone, and lost to the colocated engine (352 vs 278 ms TTFT p50).

The next turn (`next_remote`, q): D alone leaves the warmest prefiller where it was, and the conversation's next
turn, where it goes to a prefiller, computes there what this one computed on D. D alone's objective carries that,
the least prefill of the remote options times f, times q: the chance a turn's conversation goes on on a prefiller,
learned online as the recent share of turns that did (OnlineRates.observe_turn; 0 in the priors, so 0 at c=1 where
D alone serves every turn). Measured: 2026-11-26-h100x2-qwen3next-judged-vllm033 (P and D on two GPUs) at c=8,
where P recomputed 18,496 tokens D held (+17% of the prompt tokens upstream computed) on the turns after those D
alone had served, and ours lost to upstream (TTFT p50 341 vs 237 ms).

The prefiller's queue (`prefiller_queue`): a remote option's prefill on P_i delays every request that queues
behind it there, as D alone's prefill stalls D's streams. Taken as as many requests as it finds on P_i (its load:
in a steady stream, a queue is as long behind a request as ahead of it), each waiting for P's part of this one,
f * prefill(U_i). Measured: 2026-11-26-h100x2-qwen3next-judged-vllm033-r2 at c=8, where without it 30 of 40
turns went to P (25 of them finding 1-6 P calls under way) at a measured TTFT median 349 ms while D alone served
its 10 at 178-251 ms, and P recomputed 16,864 tokens D held; replayed with it on the logged decisions, D alone
wins 17 of the 30 (benchmarks/gpu/cell_timeline.py).

The objective (`itl_slo_ms`): > 0, the least TTFT (plus the next turn's term) among the options whose longest gap
on D's streams is within it (none within it: the least gap, i.e. protect the streams); 0, the least total delay
the option adds: its TTFT plus the stall of each of D's k streams (what every request waiting on D pays), plus,
remote, the delay of the requests behind it on P_i, plus, D alone, the next turn's term. Ties go to D alone (no
hop, no bytes), then to P stopping at the boundary (fewer bytes).

The choice is monotone (tests/proxy/test_placement.py checks it with Hypothesis): a busier D (not on a shared
device, where P's prefill stalls D's streams too), or a larger hit on a prefiller, never moves a turn from a
prefiller to D; a busier prefiller, or a larger hit on D, never moves it
from D to a prefiller (the prefiller's queue term grows with its load and shrinks with its hit); a worker that
cannot serve is never an option. This holds for rates with non-negative terms
whose prefill costs at least what reading its KV costs (per_token >= kv_mb_per_token * read_ms_per_mb; on every
GPU we measured, by two orders of magnitude). The factor f keeps it so: it scales only P's part of a remote option
(its queue and prefill, which grow with P's load and shrink with P's hit, and so still do times f >= 0), and no
term D's load or D's hit moves (D alone's prefill, the READ, the tail, D's steps) is scaled by it. D's queue enters
a remote option's TTFT at most as it enters D alone's. The next turn's term moves with neither D's load nor D's hit
nor a prefiller's load; a warmer prefiller shrinks it (by q <= 1 of what it takes from the remote options' P part),
so a larger prefiller hit may move a turn to D only where D's queue, not P, bounds the remote options' TTFT.

In the proxy (decider.py) the choice is D alone or remote, and where remote, P's stop; a remote turn's prefiller
is then the prefill router's pick, as with every policy (with kv_hit or queue_cost routing it is the option's P_i
or one as warm).

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
    prefiller_call_factor: float = 1.0  # f: P's call (queue + prefill) as measured over as priced (>= 0)
    next_remote: float = 0.0  # q: the chance a turn's conversation goes on with a turn on a prefiller (0..1)
    align_split: bool = False  # align mode ends a step at a prompt's last aligned boundary (vLLM < 0.32: local_steps)

    def steps(self, prompt_tokens: int, hit: int, aligned_block: int) -> int:
        """Engine steps to compute a prompt past `hit` in one request (local_steps, as this vLLM splits)."""
        return local_steps(prompt_tokens, hit, aligned_block, self.chunk_tokens, split=self.align_split)

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


# Priors: one H200, vLLM 0.26 with its default CUDA graphs (piecewise compile + full decode graphs), Qwen3-Next shapes
# (12 layers = 3 x (3 GDN + 1 attention), 544-token aligned block), from `python3 benchmarks/gpu/fit_placement_priors.py
# 2026-11-26-h200-qwen3next-full-graphs/machine-a 2026-11-26-h200-qwen3next-full-graphs/machine-b` (20 prefills,
# 14 PD turns):
#   prefill_ms_per_token           the profiled GPU kernel time per prompt token (2026-11-25-h100-prefill-steps:
#                                  123 ms for 17,399 tokens); our prompts cannot tell it from the steps' noise
#   prefill_step_ms, _per_kctx     least squares (>= 0) over the prefills as the proxy sees them (P's HTTP call,
#                                  a colocated turn's TTFT): 38 ms a step, CPU-bound launch work (2026-11-26 H200
#                                  profile: 15 ms of kernels in a 66 ms step); residual p50 20 ms; the context term
#                                  fits to 0 on these lengths
#   hop_ms                         median of PD turns' TTFT - P's call - READ - D's first step
#   read_ms_per_mb                 median of the decoders' transfer time / bytes over cuda_ipc
#   kv_mb_per_token, checkpoint_mb least squares over (tokens pulled, bytes) of our PD turns on one H100
#                                  (2026-11-24 runs; the same shape: the H200 run's decoder logs agree, 49.8 MB for
#                                  4,641 tokens, 33.1 MB for 1,857)
#   step_ms, step_ms_per_seq       the clients' ITL p50 at c=1 (5.7 ms) and c=8 (7.0 ms) of the agentic rows
# Other shapes and machines differ: the online fit (online_rates.py) takes over from a deployment's first
# requests.
PRIORS = Rates(
    prefill_step_ms=38.2,
    prefill_ms_per_token=0.00707,
    prefill_ms_per_token_per_kctx=0.0,
    hop_ms=15.0,
    read_ms_per_mb=0.0219,
    kv_mb_per_token=0.0056,
    checkpoint_mb=22.5,
    step_ms=5.71,
    step_ms_per_seq=0.18,
    chunk_tokens=8192,
    prefiller_call_factor=1.0,  # neutral: the priors are P's calls alone; a deployment's load is learned online
    next_remote=0.0,  # learned online from the turns the proxy places (OnlineRates.observe_turn)
    align_split=True,  # as the runs it was fitted on (vLLM 0.26); the proxy sets its engines' (--align-split)
)


@dataclass(frozen=True)
class WorkerView:
    """What placement knows of one worker for this request."""

    name: str
    hit: int = 0  # the prompt's usable hit on it: attention blocks AND a checkpoint at that boundary (tokens)
    load: float = 0.0  # streams in its batch or waiting for one (running + waiting)
    queued_tokens: int = 0  # prompt tokens it still has to compute for requests ahead of this one
    can_serve: bool = True  # admitted: healthy, not terminating


BOUNDARY, LAST = "boundary", "last"  # where P stops: the last aligned boundary below N, or N-1 tokens


@dataclass(frozen=True)
class Option:
    prefiller: str | None  # None: the decoder alone
    ttft_ms: float  # predicted TTFT of this request
    stall_ms: float  # the delay it adds to each of D's running streams
    gap_ms: float  # D's streams' longest inter-token gap while it runs
    cost_ms: float  # the objective with itl_slo_ms = 0: ttft + k * stall (+ next_turn_ms alone, + behind_ms remote)
    meets_itl: bool  # gap within itl_slo_ms (always, with no streams on D or no objective)
    prefill_tokens: int  # prompt tokens computed on the prefiller (0 alone)
    decoder_tokens: int  # prompt tokens computed on the decoder
    read_mb: float  # bytes D pulls
    stop: str = ""  # a remote option's stop on P: BOUNDARY or LAST ("" alone)
    prefiller_ms: float = 0.0  # a remote option's P call (queue + prefill) at the rates, before the factor f
    next_turn_ms: float = 0.0  # what it leaves the conversation's next turn: P's recompute of D alone's tokens, * q
    behind_ms: float = 0.0  # a remote option's delay of the requests that queue behind it on P (in cost_ms)


@dataclass(frozen=True)
class Placement:
    prefiller: str | None  # the chosen prefiller's name; None: the decoder alone
    reason: str  # local_fastest, remote_fastest, remote_itl_slo, remote_least_gap, local_least_gap, local_only
    chosen: Option
    options: tuple[Option, ...]  # D alone first, then each prefiller that can serve (to the boundary, to N-1)

    @property
    def local(self) -> bool:
        return self.prefiller is None

    @property
    def stop(self) -> str:
        return self.chosen.stop


def local_steps(prompt_tokens: int, hit: int, aligned_block: int, chunk_tokens: int, split: bool = True) -> int:
    """Engine steps an engine takes to compute a prompt past `hit` by itself. With `split`, vLLM's align mode
    (hybrid models) ends a step at the last aligned boundary below the prompt's last token, so that the state
    there can be cached, and computes the rest in one more step (vLLM 0.26, 2026-11-25-h100-prefill-steps: 4,857 =
    4,352 + 505); a prompt cut at a boundary (P's boundary stop) takes two: 0.32+ caches a state only below a
    prompt's last token (get_mamba_prefill_checkpoint_position; 0.26 one step there). Without `split`, the chunks
    alone: the kernels' prefill checkpoints write the state inside the last chunk (`use_internal_checkpoint`)."""
    chunk = max(chunk_tokens, 1)
    if aligned_block <= 0 or not split:
        return max(1, math.ceil((prompt_tokens - hit) / chunk))
    boundary = ((prompt_tokens - 1) // aligned_block) * aligned_block
    before = math.ceil((boundary - hit) / chunk) if boundary > hit else 0
    return max(1, before + math.ceil((prompt_tokens - max(boundary, hit)) / chunk))


def remote_tail(prompt_tokens: int, aligned_block: int, stop: str = BOUNDARY) -> int:
    """Tokens D computes itself after a pull: P stops at the last aligned boundary below the prompt's end (a
    hybrid model, aligned_block > 0, stop BOUNDARY), or one token short (vLLM computes the last token on D; also
    where no boundary lies below the end, as the connector does)."""
    if prompt_tokens <= 1:
        return max(prompt_tokens, 0)
    boundary = (prompt_tokens - 1) // aligned_block * aligned_block if aligned_block > 0 else 0
    if stop == LAST or boundary <= 0:
        return 1
    return prompt_tokens - boundary


def place(
    prompt_tokens: int,
    decoder: WorkerView,
    prefillers: Sequence[WorkerView],
    rates: Rates = PRIORS,
    *,
    itl_slo_ms: float = 0.0,
    aligned_block: int = 0,
    shared_device: float = 0.0,
    prefiller_queue: bool = True,
    stop: str = "",
) -> Placement:
    """The option for a `prompt_tokens` prompt whose decoder is `decoder` (see the module's docstring). Only
    prefillers that can serve are options; with none, D alone. Hits and `shared_device` (True: 1) are clamped to
    [0, N - 1] and [0, 1]. `stop` (BOUNDARY or LAST) leaves only the remote options that stop so ("": both)."""
    if not decoder.can_serve:
        raise ValueError(f"decoder {decoder.name} cannot serve: pick another before placing")
    n = max(int(prompt_tokens), 1)
    k = max(decoder.load, 0.0)
    slo = max(itl_slo_ms, 0.0)
    shared = min(max(float(shared_device), 0.0), 1.0)
    stops = (BOUNDARY, LAST) if remote_tail(n, aligned_block) > 1 else (LAST,)
    if stop in stops:
        stops = (stop,)
    remotes = [
        _remote(n, stop, decoder, p, k, rates, slo, aligned_block, shared, prefiller_queue)
        for p in prefillers
        if p.can_serve
        for stop in stops
    ]
    local = _local(n, decoder, k, rates, slo, aligned_block, next_turn_ms(rates, n, remotes))
    options = (local, *remotes)
    if not remotes:
        return Placement(None, "local_only", local, options)
    if slo <= 0:
        best = min(options, key=lambda o: o.cost_ms)  # the first of equals: D alone wins ties
        return Placement(best.prefiller, "local_fastest" if best is local else "remote_fastest", best, options)
    within = [o for o in options if o.meets_itl]
    if within:
        best = min(within, key=lambda o: o.ttft_ms + o.next_turn_ms)
        if best is local:
            return Placement(None, "local_fastest", best, options)
        return Placement(best.prefiller, "remote_fastest" if local.meets_itl else "remote_itl_slo", best, options)
    # apart, a remote gap never exceeds D alone's; on a shared device P's steps may. Equal gaps (a remote option
    # whose tail on D is D alone's) go by the objective used within the SLO, so that a larger hit on D, which
    # brings both gaps under it together, cannot turn a choice of D into one of P
    best = min(options if shared > 0 else remotes, key=lambda o: (o.gap_ms, o.ttft_ms + o.next_turn_ms))
    if best is local:
        return Placement(None, "local_least_gap", best, options)
    return Placement(best.prefiller, "remote_least_gap", best, options)


def queue_ms(rates: Rates, queued_tokens: int, load: float) -> float:
    """A worker's queue ahead of this request: the engine steps its queued prompt tokens need (a step batches
    several requests' chunks) and their tokens; one step where it runs requests whose tokens this proxy does not
    know (another proxy's, or its own in their decode)."""
    steps = rates.chunks(queued_tokens) if queued_tokens > 0 else (1 if load > 0 else 0)
    return steps * rates.prefill_step_ms + max(queued_tokens, 0) * rates.prefill_ms_per_token


def d_queue_ms(rates: Rates, d: WorkerView) -> float:
    """The prompt tokens queued on D ahead of this request, at the per-token rate (they ride in D's steps)."""
    return d.queued_tokens * rates.prefill_ms_per_token if d.queued_tokens > 0 else 0.0


def decoder_tail_ms(rates: Rates, n: int, tokens: int, steps: int | None = None) -> float:
    """D's time for the last `tokens` of an `n`-token prompt (after a pull, or alone): one token rides in D's decode
    step (its per-token cost over its context, no step of its own); more are a prefill of their own, in mixed steps
    that each running stream waits for. One function for both options, so that a larger hit on D never makes the
    pulled option cheaper than D alone (tests/proxy/test_placement.py)."""
    if tokens <= 1:
        return rates.prefill_ms(tokens, n - tokens, steps=0)
    return rates.prefill_ms(tokens, n - tokens, steps)


def pulled_mb(rates: Rates, end: int, d_hit: int, stop: str, aligned_block: int) -> float:
    """What D pulls after P stopped at `end`: the KV of the tokens past D's own hit, the state at P's stop, and at
    N-1 the aligned checkpoint below it (P ships it for D to keep; counted whatever D holds, so that a larger hit
    on D never makes a remote option cheaper by more than D alone: tests/proxy/test_placement.py)."""
    below = end // aligned_block * aligned_block if aligned_block > 0 else 0
    checkpoints = 1 + (stop == LAST and below > 0)
    return max(end - d_hit, 0) * rates.kv_mb_per_token + checkpoints * rates.checkpoint_mb


def next_turn_ms(rates: Rates, n: int, remotes: Sequence[Option]) -> float:
    """What D alone leaves the conversation's next turn: the warmest prefiller, which a remote option would have
    brought up to its stop, stays where it was, and the next turn, where it goes to a prefiller (with chance q,
    `next_remote`), computes there what this one computed on D: the least prefill of the remote options, its
    tokens in the steps they need, times f (2026-11-26-h100x2-qwen3next-judged-vllm033, c=8: P recomputed 18,496
    tokens that D held, +17% of the prompt tokens upstream computed, on the turns after one served by D alone)."""
    q = min(max(rates.next_remote, 0.0), 1.0)
    if q <= 0 or not remotes:
        return 0.0
    fewest = min(remotes, key=lambda o: o.prefill_tokens)
    tokens = fewest.prefill_tokens
    return q * max(rates.prefiller_call_factor, 0.0) * rates.prefill_ms(tokens, n - tokens)


def _local(
    n: int, d: WorkerView, k: float, rates: Rates, slo: float, aligned_block: int, next_ms: float = 0.0
) -> Option:
    hit = min(max(d.hit, 0), n - 1)
    u = n - hit
    steps = rates.steps(n, hit, aligned_block)
    prefill = decoder_tail_ms(rates, n, u, steps)
    wait = d_queue_ms(rates, d)
    ttft = wait + prefill + steps * rates.step_ms_per_seq * k  # D's streams decode in each of those steps
    # the costliest step is a full chunk at the prompt's end (the most context): an upper bound on any gap
    last = min(u, rates.chunk_tokens)
    gap = rates.step(k + 1) + decoder_tail_ms(rates, n, last, steps=1)
    meets = k <= 0 or slo <= 0 or gap <= slo
    return Option(None, ttft, prefill, gap, ttft + k * prefill + next_ms, meets, 0, u, 0.0, next_turn_ms=next_ms)


def _remote(
    n: int,
    stop: str,
    d: WorkerView,
    p: WorkerView,
    k: float,
    rates: Rates,
    slo: float,
    aligned_block: int,
    shared: float = 0.0,
    queue: bool = True,
) -> Option:
    end = n - remote_tail(n, aligned_block, stop)  # where P stops
    p_hit = min(max(p.hit, 0), end)
    u = max(end - p_hit, 1 if end > 0 else 0)  # P computes at least one token per call
    p_steps = rates.steps(end, p_hit, aligned_block)  # at the boundary too: a step a block below it where vLLM splits
    d_hit = min(max(d.hit, 0), n - 1)
    on_d = n - max(end, d_hit)  # then computes what is left: the tail, or less where it holds more
    read_mb = pulled_mb(rates, end, d_hit, stop, aligned_block)  # D keeps its own hit and pulls the rest
    p_prefill = rates.prefill_ms(u, p_hit, p_steps)
    call_ms = queue_ms(rates, p.queued_tokens, p.load) + p_prefill  # P's part, priced
    step = rates.step(k + 1)
    tail_ms = decoder_tail_ms(rates, n, on_d)
    last = min(on_d, rates.chunk_tokens)
    gap_ms = decoder_tail_ms(rates, n, last, steps=1)  # its costliest step
    stall, shared_ms = tail_ms, 0.0
    if shared > 0:  # P's steps take the GPU from D's streams (that share of D's own prefill), and D's steps from P's
        stall += shared * p_prefill
        shared_ms = shared * p_steps * rates.step_ms_per_seq * k
        p_last = min(u, rates.chunk_tokens)
        gap_ms = max(gap_ms, shared * rates.prefill_ms(p_last, end - p_last, 1))
    factor = max(rates.prefiller_call_factor, 0.0)
    pulled_ms = call_ms * factor + shared_ms + rates.hop_ms + read_mb * rates.read_ms_per_mb
    # D's first step for this turn waits for the prompt tokens queued on D that are still to compute by then
    ttft = max(pulled_ms, d_queue_ms(rates, d)) + step + tail_ms
    gap = step + gap_ms
    meets = k <= 0 or slo <= 0 or gap <= slo
    behind = max(p.load, 0.0) * factor * p_prefill if queue else 0.0  # the requests that queue behind it on P
    cost = ttft + k * stall + behind
    return Option(p.name, ttft, stall, gap, cost, meets, u, on_d, read_mb, stop, call_ms, behind_ms=behind)
