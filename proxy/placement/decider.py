"""The placement decision for one turn of the PD flow, and what the turn then teaches the cost model's rates.

decide(turn, D)      the shared gates, then the policy (disagg.decide) over the request's hits (its hit memo,
                     kv/request_hits.py) and the workers' loads; policy ours runs the cost model over D and
                     every admitted prefiller (cost_model.place)
misroute(turn, D)    a hybrid misroute counted: D computed a prompt for a hit that was attention-only
learn_prefiller_call(turn)
                     as soon as P has answered a remote turn: its call against what the chosen option priced
                     for it (the factor on P's queue + prefill, online_rates.py)
learn(turn)          once the turn has ended, the rates fed what it showed: P's call as a prefill where P ran it
                     alone, a streamed turn D served alone as one, what a PD turn's TTFT had beyond P's call as
                     the hop; with --log-placement, one line of it per turn (TTFT, P's call, its price, the factor)
observe_step(...)    a streamed answer's inter-token time as D's step at its batch
"""

from __future__ import annotations

import dataclasses
import logging
import time

from ..kv.groups import aligned_block
from ..metrics import FlowRecorder
from ..routing import RequestContext
from ..state import ProxyState
from ..turn import LOCAL_PREFILL, REMOTE_PREFILL, Turn
from ..workers import Worker
from .cost_model import (
    BOUNDARY,
    LAST,
    Option,
    Placement,
    WorkerView,
    decoder_tail_ms,
    place,
    pulled_mb,
    remote_tail,
)
from .disagg import decide, gate, is_remote
from .peer_policies import ATTENTION_ONLY

log = logging.getLogger("hybrid_pd.proxy")


class Decider:
    def __init__(self, state: ProxyState, record: FlowRecorder):
        self.state = state
        self.config = state.config.disagg
        self.record = record
        if self.config.pd_policy == "hit-ratio":
            log.warning(
                "--decoder-hit-ratio selects the deprecated --pd-policy hit-ratio (a share of the prompt on the "
                "decoder); the default policy (ours) places each turn by its predicted TTFT "
                "(proxy/placement/cost_model.py)"
            )

    def decide(self, turn: Turn, decoder: Worker) -> str:
        """The policy's decision (disagg.py); the cost model runs only past the shared gates."""
        cfg, context, body, state = self.config, turn.context, turn.body, self.state
        prompt_tokens = len(context.token_ids) if context.token_ids else None
        block = aligned_block(state.kv_index.specs)
        turn.streams = decoder.streams  # every proxy's streams where D's /metrics are read
        turn.decided = time.perf_counter()
        has_prefillers = state.pool.has("prefill")
        gated = gate(
            cfg,
            eligible=body.single_prompt,
            has_prefillers=has_prefillers,
            prompt_chars=body.prompt_chars,
            prompt_tokens=prompt_tokens,
        )
        policy, attention_hit = cfg.pd_policy, None
        if gated is None and prompt_tokens is not None:
            if policy == "ours" and (prefillers := state.pool.admitted("prefill")):
                turn.placement = self._place(context, decoder, prefillers, prompt_tokens, block)
                turn.diverged = self._diverged(turn, decoder, block)
                if cfg.log_placement:
                    log.info("placement %s: %s", turn.headers["X-Request-Id"], describe(turn.placement, prompt_tokens))
            elif policy in ATTENTION_ONLY and state.kv_index.workers:
                attention_hit = context.attention_only(state.deps).get(decoder.url, 0)
        decision = decide(
            cfg,
            eligible=body.single_prompt,
            has_prefillers=has_prefillers,
            prompt_chars=body.prompt_chars,
            prompt_tokens=prompt_tokens,
            decoder_hit=self._decoder_hit(context, decoder),
            aligned_block=block,
            decoder_busy=round(decoder.load),
            prefill_hit=self._best_prefill_hit(context) if policy == "hit-ratio" else None,
            placement=turn.placement,
            attention_hit=attention_hit,
        )
        if turn.placement is not None:  # how often a conversation goes on on a prefiller (cost_model.next_turn_ms)
            held = any(hit > 0 for hit in context.all_hits(state.deps).values())  # memoized by _place
            state.rates.observe_turn(continued=held, remote=is_remote(decision))
        return decision

    def _place(
        self, context: RequestContext, decoder: Worker, prefillers: list[Worker], prompt_tokens: int, block: int
    ) -> Placement:
        """cost_model.place over the decoder and every admitted prefiller, with their joint hits (0 where the
        index knows none) and loads, at the rates learned so far."""
        state = self.state
        hits = context.all_hits(state.deps) if state.kv_index.workers else {}
        d = WorkerView(decoder.url, hits.get(decoder.url, 0), decoder.streams, decoder.queued_tokens)
        ps = [WorkerView(p.url, hits.get(p.url, 0), p.streams, p.queued_tokens) for p in prefillers]
        config = self.config
        rates = state.rates.rates
        if not config.next_turn:
            rates = dataclasses.replace(rates, next_remote=0.0)
        return place(
            prompt_tokens,
            d,
            ps,
            rates,
            itl_slo_ms=config.itl_slo_ms,
            aligned_block=block,
            shared_device=config.shared_device_stall if config.shared_device else 0.0,
            prefiller_queue=config.prefiller_queue,
            stop="" if config.prefiller_stop == "model" else config.prefiller_stop,
        )

    def _diverged(self, turn: Turn, decoder: Worker, block: int) -> bool:
        """A remote chat turn that diverged from D's cache where D held attention blocks but no checkpoint (its
        attention-only hit on D at least a block past its joint one): the conversation re-sends an earlier
        prompt's beginning without its end, as an agent loop with a fixed last instruction does. The flow then
        asks P to stop where this prompt's last message starts (pd_flow.py, --junction-checkpoints)."""
        placement = turn.placement
        if not self.config.junction_checkpoints or placement is None or placement.local or block <= 0:
            return False
        state = self.state
        if turn.body.endpoint != "chat" or state.tokenizer is None or decoder.url not in state.kv_index.workers:
            return False  # the junction is a chat prompt's, found by the proxy's own tokenizer
        context = turn.context
        attention = context.attention_only(state.deps).get(decoder.url, 0)
        return attention - context.hit_on(state.deps, decoder.url) >= block

    def _decoder_hit(self, context: RequestContext, decoder: Worker) -> int | None:
        if not context.token_ids or decoder.url not in self.state.kv_index.workers:
            return None
        return context.hit_on(self.state.deps, decoder.url)

    def _best_prefill_hit(self, context: RequestContext) -> int | None:
        """The largest usable hit of the prompt on an admitted prefiller, None where the index knows none."""
        known = [w for w in self.state.pool.admitted("prefill") if w.url in self.state.kv_index.workers]
        if not context.token_ids or not known:
            return None
        return max(context.hit_on(self.state.deps, w.url) for w in known)

    def misroute(self, turn: Turn, decoder: Worker, decision: str) -> None:
        """A hybrid misroute: the decider let D compute the prompt for a hit it counted over attention blocks
        alone, past D's last checkpoint there (the peers' deciders read attention-only hits; ours and hit-ratio
        the joint one, so theirs is never one). Counted with the tokens D recomputes for it."""
        attention = turn.context.attention_hits  # ours reads them too (_diverged), never to decide where
        if self.config.pd_policy not in ATTENTION_ONLY or attention is None:
            return
        if is_remote(decision) and turn.transfer_params is not None:
            return
        over = attention.get(decoder.url, 0) - turn.context.hit_on(self.state.deps, decoder.url)
        if over > 0:
            self.record.misroute(self.config.pd_policy, over)

    def learn_prefiller_call(self, turn: Turn) -> None:
        """As soon as P has answered a remote turn: its call against what the chosen option priced for it (the
        factor on P's queue + prefill, online_rates.py). Here rather than at the turn's end, a stream sooner: the
        turns decided meanwhile are priced with it (the 2026-11-26 H200 replay: remote turns' median measured /
        predicted 1.13x, 1.21x learning at their end; tests/proxy/test_placement_replay.py)."""
        chosen = turn.placement.chosen if turn.placement is not None else None
        if turn.mode == REMOTE_PREFILL and turn.prefill_ms is not None and chosen is not None and chosen.prefiller:
            self.state.rates.observe_prefiller_call(chosen.prefiller_ms, turn.prefill_ms)
        splits = (turn.transfer_params or {}).get("engine_splits")  # our prefillers say; other connectors do not
        if isinstance(splits, bool):
            self.state.rates.observe_align_split(splits)

    def learn(self, turn: Turn) -> None:
        """Feed the cost model's rates with what this turn showed (online_rates.py), once it has ended: P's call as
        a prefill where P ran it alone; a streamed turn D served alone (its TTFT) as one; what a PD turn's TTFT had
        beyond P's call as the hop. (P's call against its price was learned when P answered.)"""
        n = len(turn.context.token_ids or ())
        if n < 2:
            return
        rates = self.state.rates
        r = rates.rates
        block = aligned_block(self.state.kv_index.specs)
        ttft = (turn.first_byte - turn.decided) * 1000 if turn.first_byte is not None else None
        chosen = turn.placement.chosen if turn.placement is not None else None
        if turn.mode == REMOTE_PREFILL and turn.prefill_ms is not None:
            end = prefill_stop(turn, n, block)
            p_hit = min(turn.prefill_hit or 0, end)
            computed = max(end - p_hit, 1)
            if turn.prefill_alone:
                said = (turn.transfer_params or {}).get("prefill_steps")  # our P counts them; else as modelled
                steps = said if type(said) is int and said > 0 else r.steps(end, p_hit, block)
                rates.observe_prefill(computed, p_hit, steps, turn.prefill_ms)
            if ttft is not None:
                d_hit = min(turn.decoder_hit or 0, end)
                stop = LAST if end >= n - 1 else BOUNDARY
                read = pulled_mb(r, end, d_hit, stop, block) * r.read_ms_per_mb
                tail_ms = decoder_tail_ms(r, n, n - end)
                rates.observe_hop(ttft - turn.prefill_ms - read - r.step(turn.streams + 1) - tail_ms)
        elif (
            turn.mode == LOCAL_PREFILL
            and ttft is not None
            and turn.placement is not None
            and (turn.decode_alone or not self.config.learn_local_alone)
        ):
            hit = turn.reported_hit if turn.reported_hit is not None else n - turn.placement.options[0].decoder_tokens
            hit = min(max(hit, 0), n - 1)
            steps = r.steps(n, hit, block)
            rates.observe_prefill(n - hit, hit, steps, ttft - steps * r.step_ms_per_seq * turn.streams)
        if self.config.log_placement and chosen is not None and ttft is not None:
            said = outcome(chosen, ttft, turn.mode, turn.prefill_ms, rates.prefiller_call_factor)
            log.info("placement %s: %s", turn.headers["X-Request-Id"], said)

    def observe_step(self, turn: Turn, completion_tokens: int, ended: float) -> None:
        """A streamed answer of more than one token: its mean inter-token time as D's step at its batch."""
        if turn.first_byte is not None and completion_tokens > 1:
            step_ms = (ended - turn.first_byte) * 1000 / (completion_tokens - 1)
            self.state.rates.observe_step(turn.streams + 1, step_ms)


def prefill_stop(turn: Turn, n: int, block: int) -> int:
    """Where P stopped computing the turn's prompt: the tokens its kv_transfer_params say it computed, else where
    the placement asked it to stop (the last aligned boundary below N, or N-1)."""
    said = (turn.transfer_params or {}).get("remote_num_tokens")
    if isinstance(said, int) and 0 < said < n:
        return said
    stop = turn.placement.stop if turn.placement is not None else BOUNDARY
    return n - remote_tail(n, block, stop or BOUNDARY)


def outcome(chosen: Option, ttft: float, mode: str, prefill_ms: float | None, factor: float) -> str:
    """One line: a turn's TTFT against the chosen option's prediction, its mode, P's call against what the option
    priced for it (before the factor), and the factor on P's call after the turn (benchmarks/gpu/placement_log.py
    reads it)."""
    line = f"TTFT {ttft:.1f} ms (predicted {chosen.ttft_ms:.1f}), {mode}"
    if prefill_ms is not None:
        line += f", P's call {prefill_ms:.1f} ms"
        if chosen.prefiller is not None:
            line += f" (priced {chosen.prefiller_ms:.1f})"
    return line + f", P factor {factor:.3f}"


def describe(placement: Placement, prompt_tokens: int) -> str:
    """One line: the choice, then every option's prediction (ms) and its split of the prompt."""
    options = "; ".join(
        f"{o.prefiller or 'D'}{'@' + o.stop if o.stop else ''} ttft {o.ttft_ms:.1f} stall {o.stall_ms:.1f} "
        f"cost {o.cost_ms:.1f} P {o.prefill_tokens} D {o.decoder_tokens}"
        + (f" behind {o.behind_ms:.1f}" if o.behind_ms else "")  # the prefiller's queue term, in cost
        for o in placement.options
    )
    chosen = (placement.prefiller or "D") + ("@" + placement.stop if placement.stop else "")
    return f"{prompt_tokens} tokens -> {chosen} ({placement.reason}); {options}"
