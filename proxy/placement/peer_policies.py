"""The field's disaggregation deciders, as policies of this proxy (`--pd-policy`), on the same engines and flow.

Each answers one question for a turn whose decoder D is already chosen: compute the prompt on D alone (True), or
on a prefiller first (False). Like their originals they read the decoder's prefix overlap over attention blocks
only: a hybrid model's Mamba checkpoints are not looked at, so a decoder holding the attention blocks of a prefix
but no checkpoint at that boundary counts as holding the prefix (the hybrid misroute the proxy counts).

    always-remote       every turn through a prefiller (upstream vLLM's toy proxy)
    isl-bounding        NVIDIA Dynamo's conditional disaggregation, policy `isl_bounding`: D alone when the
                        effective input (prompt - D's overlap) is under `max_tokens` (2,048) AND under `ratio`
                        (0.7) of the prompt
    non-cached-tokens   llm-d's prefix-based PD decider: a prefiller when the tokens D has not cached reach
                        `threshold` (`nonCachedTokens`; 128 = 8 of its prefix plugin's 16-token blocks)

Pure functions: the fleet simulator imports them with cost_model.place.
"""

from __future__ import annotations

ATTENTION_ONLY = ("isl-bounding", "non-cached-tokens")  # the policies that decide on attention-only overlap
ISL_MAX_TOKENS, ISL_RATIO = 2048, 0.7
NON_CACHED_TOKENS = 128


def isl_bounding_local(
    prompt_tokens: int, overlap: int, max_tokens: int = ISL_MAX_TOKENS, ratio: float = ISL_RATIO
) -> bool:
    """Dynamo's isl_bounding: D alone iff eff_isl < max_tokens and eff_isl / isl < ratio."""
    if prompt_tokens <= 0:
        return True
    effective = prompt_tokens - min(max(overlap, 0), prompt_tokens)
    return effective < max_tokens and effective / prompt_tokens < ratio


def non_cached_tokens_local(prompt_tokens: int, overlap: int, threshold: int = NON_CACHED_TOKENS) -> bool:
    """llm-d's prefix-based PD decider: disaggregate iff the uncached tokens reach the threshold (0: never)."""
    if threshold <= 0:
        return True
    return prompt_tokens - min(max(overlap, 0), prompt_tokens) < threshold
