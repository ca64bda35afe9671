"""Conditional disaggregation: after the decoder is chosen, prefill remotely on P, or let D prefill itself.

Remote prefill pays a round trip and a KV transfer; it is worth it only for a prompt long enough, on a
decoder that does not already hold most of it (a multi-turn session on its warm decoder).
"""

from __future__ import annotations

from .config_sections import DisaggConfig

REMOTE = "remote"


def decide(
    cfg: DisaggConfig,
    *,
    eligible: bool,
    has_prefillers: bool,
    prompt_chars: int,
    prompt_tokens: int | None,
    decoder_hit: int | None,
    aligned_block: int = 0,
) -> str:
    """'remote', or the reason to prefill on the decoder: local_disabled, local_ineligible (several prompts
    or n > 1: kv_transfer_params are per request), local_no_prefiller, local_short, local_small_uncached (what
    D lacks, past its own attention + checkpoint hit, is under `min_uncached_blocks` aligned blocks: nothing P
    could cache for later, and a round trip plus a transfer cost more than D computing it), local_decoder_hit."""
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
        return "local_small_uncached"
    if decoder_hit and prompt_tokens and decoder_hit / prompt_tokens >= cfg.decoder_hit_ratio:
        return "local_decoder_hit"
    return REMOTE
