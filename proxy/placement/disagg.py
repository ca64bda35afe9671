"""Conditional disaggregation: once the decoder D is chosen, prefill remotely on a prefiller P, or let D prefill.

The gates every policy shares come first (remote prefill off, a request that cannot cross, no prefiller, a short
prompt). Then the policy in force (--pd-policy, config DisaggConfig.pd_policy) decides:

    ours               cost_model.place: the option with the least predicted TTFT within the ITL objective, in
                       milliseconds, from every worker's joint attention + checkpoint hit and load (cost_model.py)
    always-remote      remote whenever the gates let it
    isl-bounding       Dynamo's rule on D's attention-only overlap (peer_policies.py)
    non-cached-tokens  llm-d's rule on D's attention-only overlap (peer_policies.py)
    hit-ratio          deprecated: D when it holds --decoder-hit-ratio of the prompt, or lacks under
                       --min-uncached-blocks aligned blocks, while a cost model in prefill tokens agrees
                       (`local_is_cheaper`)

A decision is a label: 'remote...' prefills on P, 'local_...' on D (decider.py; the disagg_decisions metric).
"""

from __future__ import annotations

from ..config.disagg import DisaggConfig
from .cost_model import Placement
from .peer_policies import isl_bounding_local, non_cached_tokens_local

REMOTE = "remote"
REMOTE_DECODER_BUSY = "remote_decoder_busy"
LEGACY_RATIO = 0.8  # policy hit-ratio's share without --decoder-hit-ratio (the old default)


def is_remote(decision: str) -> bool:
    return decision.startswith(REMOTE)


def decide(
    cfg: DisaggConfig,
    *,
    eligible: bool,
    has_prefillers: bool,
    prompt_chars: int,
    prompt_tokens: int | None,
    decoder_hit: int | None,
    aligned_block: int = 0,
    decoder_busy: int = 0,
    prefill_hit: int | None = None,
    placement: Placement | None = None,
    attention_hit: int | None = None,
) -> str:
    """The shared gates (`gate`), then the policy's decision:
    - ours: `placement`'s (remote / remote_itl_slo / remote_least_gap, or local_placement); without one (the
      prompt was not tokenized) remote;
    - isl-bounding, non-cached-tokens: local_isl_bounding / local_non_cached or remote, from D's attention-only
      overlap `attention_hit` (none known: 0);
    - always-remote: remote;
    - hit-ratio: local_small_uncached, local_decoder_hit, remote_decoder_busy or remote (`_hit_ratio`)."""
    gated = gate(
        cfg, eligible=eligible, has_prefillers=has_prefillers, prompt_chars=prompt_chars, prompt_tokens=prompt_tokens
    )
    if gated is not None:
        return gated
    policy = cfg.pd_policy
    if policy == "always-remote" or (prompt_tokens is None and policy != "hit-ratio"):
        return REMOTE
    if policy == "ours":
        if placement is None:
            return REMOTE
        if placement.local:
            return "local_placement"
        return {"remote_itl_slo": "remote_itl_slo", "remote_least_gap": "remote_least_gap"}.get(
            placement.reason, REMOTE
        )
    if policy == "isl-bounding":
        local = isl_bounding_local(prompt_tokens or 0, attention_hit or 0, cfg.isl_max_tokens, cfg.isl_ratio)
        return "local_isl_bounding" if local else REMOTE
    if policy == "non-cached-tokens":
        local = non_cached_tokens_local(prompt_tokens or 0, attention_hit or 0, cfg.non_cached_tokens)
        return "local_non_cached" if local else REMOTE
    return _hit_ratio(cfg, prompt_tokens, decoder_hit, aligned_block, decoder_busy, prefill_hit)


def gate(
    cfg: DisaggConfig, *, eligible: bool, has_prefillers: bool, prompt_chars: int, prompt_tokens: int | None
) -> str | None:
    """The gates every policy shares, or None past them: local_disabled, local_ineligible (several prompts or
    n > 1: kv_transfer_params are per request), local_no_prefiller, local_short."""
    if not cfg.enabled:
        return "local_disabled"
    if not eligible:
        return "local_ineligible"
    if not has_prefillers:
        return "local_no_prefiller"
    if cfg.min_prompt_tokens and prompt_tokens is not None and prompt_tokens < cfg.min_prompt_tokens:
        return "local_short"
    if cfg.min_prompt_chars and prompt_tokens is None and prompt_chars < cfg.min_prompt_chars:
        return "local_short"  # characters decide only when the token count is unknown
    return None


def _hit_ratio(
    cfg: DisaggConfig,
    prompt_tokens: int | None,
    decoder_hit: int | None,
    aligned_block: int,
    decoder_busy: int,
    prefill_hit: int | None,
) -> str:
    """The deprecated rule: local_small_uncached (what D lacks, past its own attention + checkpoint hit, is under
    `min_uncached_blocks` aligned blocks: nothing P could cache for later, and a round trip plus a transfer cost
    more than D computing it), local_decoder_hit (D holds `decoder_hit_ratio` of the prompt); either only when
    `local_is_cheaper` agrees, given the streams in flight on D and the best prefiller's hit; else
    remote_decoder_busy."""
    if (
        cfg.min_uncached_blocks
        and aligned_block
        and prompt_tokens is not None
        and prompt_tokens - (decoder_hit or 0) < cfg.min_uncached_blocks * aligned_block
    ):
        candidate = "local_small_uncached"
    elif decoder_hit and prompt_tokens and decoder_hit / prompt_tokens >= (cfg.decoder_hit_ratio or LEGACY_RATIO):
        candidate = "local_decoder_hit"
    else:
        return REMOTE
    if prompt_tokens is None or not cfg.load_aware:
        return candidate
    cheaper = local_is_cheaper(prompt_tokens, decoder_hit or 0, prefill_hit, decoder_busy, cfg.remote_overhead_tokens)
    return candidate if cheaper else REMOTE_DECODER_BUSY


def local_is_cheaper(prompt: int, decoder_hit: int, prefill_hit: int | None, decoder_busy: int, overhead: int) -> bool:
    """The delay a choice adds, summed over the requests it touches, in tokens of prefill compute:
    - on D: its `prompt - decoder_hit` uncached tokens, waited for by this request and by each of the
      `decoder_busy` streams D is decoding (their next tokens come after that prefill);
    - via P: P's uncached tokens (`prompt - prefill_hit`; the whole prompt when P's hit is unknown) plus the
      remote path's fixed cost (`overhead`: the hop to P, the READ, D's wait for it), for this request only.
    On GPUs P and D prefill at the same rate, so tokens compare directly."""
    on_decoder = (prompt - decoder_hit) * (1 + decoder_busy)
    via_prefiller = overhead + prompt - (prefill_hit or 0)
    return on_decoder <= via_prefiller
