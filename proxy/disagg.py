"""Conditional disaggregation: after the decoder is chosen, prefill remotely on P, or let D prefill itself.

Remote prefill pays a round trip and a KV transfer; it is worth it only for a prompt long enough, on a
decoder that does not already hold most of it (a multi-turn session on its warm decoder). And a prefill on D
is not free for the others: each stream D is decoding waits for it. So where D holds enough of the prompt to be
a candidate, one cost model in prefill tokens decides (`local_is_cheaper`).
"""

from __future__ import annotations

from .config.sections import DisaggConfig

REMOTE = "remote"
REMOTE_DECODER_BUSY = "remote_decoder_busy"


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
) -> str:
    """'remote' / 'remote_decoder_busy' (prefill on P), or the reason to prefill on the decoder: local_disabled,
    local_ineligible (several prompts or n > 1: kv_transfer_params are per request), local_no_prefiller,
    local_short, local_small_uncached (what D lacks, past its own attention + checkpoint hit, is under
    `min_uncached_blocks` aligned blocks: nothing P could cache for later, and a round trip plus a transfer cost
    more than D computing it), local_decoder_hit. The last two only when `local_is_cheaper` agrees, given the
    streams in flight on D (`decoder_busy`) and the best prefiller's hit; else remote_decoder_busy."""
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
    if (
        cfg.min_uncached_blocks
        and aligned_block
        and prompt_tokens is not None
        and prompt_tokens - (decoder_hit or 0) < cfg.min_uncached_blocks * aligned_block
    ):
        candidate = "local_small_uncached"
    elif decoder_hit and prompt_tokens and decoder_hit / prompt_tokens >= cfg.decoder_hit_ratio:
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
