"""`usage.prompt_tokens_details.cached_tokens` for a disaggregated request, and rewriting it in D's answer.

The rule. A prompt token counts as cached when its KV came out of a cache instead of being computed for
this request. In a PD turn the decoder D uses, for prompt position i:

    i <  D_local          D's own prefix cache                         cached
    i <  P_hit            P's prefix cache, shipped to D               cached
    otherwise             computed by P for this request, shipped      not cached

Both are prefixes of the same prompt, so cached = max(P_hit, D_local), never more than the prompt.
What vLLM reports is wrong both ways: D counts every token pulled from P as its own hit (close to 100%);
vLLM 0.32's `remote_prefill_cached_tokens` replaces that with P's hit alone and forgets D_local.
P_hit is P's own `usage.prompt_tokens_details.cached_tokens` (or `remote_prefill_cached_tokens` in its
kv_transfer_params); D_local is the KV-event index's usable hit on D (0 when the index is off: the proxy
then under-reports rather than invent hits). A decode-only request keeps D's own figure: nothing was pulled.

For billing, `usage.hybrid_pd` splits it (`breakdown`; --usage-breakdown, on by default), cached_tokens staying
the client's truth:

    prefill_cached_tokens   P's own hit (null on a turn D served alone)
    decoder_cached_tokens   D's own hit: what D reported on a turn it served alone; the index's estimate of
                            D_local on a PD turn (D's own figure counts the pulled tokens)
    computed_on             "prefill" (P computed the prompt, D at most its tail) or "decode" (D alone)
"""

from __future__ import annotations

from typing import Any


def whole_request_cached_tokens(p_hit: int | None, d_local_hit: int | None, prompt_tokens: int | None) -> int:
    """D's own figure is not an input: it is either ~100% (pulled tokens) or P's alone (vLLM 0.32)."""
    cached = max(p_hit or 0, d_local_hit or 0)
    if prompt_tokens is not None:
        cached = min(cached, prompt_tokens)
    return max(cached, 0)


def prefill_hit(prefill_response: dict[str, Any]) -> int | None:
    """P's own prefix hit from its response: usage details, else vLLM's remote_prefill_cached_tokens."""
    usage = prefill_response.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            return details["cached_tokens"]
    ktp = prefill_response.get("kv_transfer_params")
    if isinstance(ktp, dict) and isinstance(ktp.get("remote_prefill_cached_tokens"), int):
        return ktp["remote_prefill_cached_tokens"]
    return None


def fix_usage(response: dict[str, Any], p_hit: int | None, d_local_hit: int | None) -> int | None:
    """Rewrite cached_tokens in a decoder response (or SSE chunk) in place; returns the value written, or None
    when the response carries no prompt_tokens_details (the worker runs without --enable-prompt-tokens-details:
    the proxy then adds nothing)."""
    usage = response.get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict) or not isinstance(details.get("cached_tokens"), int):
        return None
    prompt_tokens = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else None
    details["cached_tokens"] = whole_request_cached_tokens(p_hit, d_local_hit, prompt_tokens)
    return details["cached_tokens"]


def breakdown(response: dict[str, Any], p_hit: int | None, d_hit: int | None, computed_on: str) -> None:
    """Add usage.hybrid_pd to a response (or SSE chunk) that carries usage, in place."""
    usage = response.get("usage")
    if isinstance(usage, dict):
        usage["hybrid_pd"] = {
            "prefill_cached_tokens": p_hit if computed_on == "prefill" else None,
            "decoder_cached_tokens": d_hit or 0,
            "computed_on": computed_on,
        }


def reported_cached(response: dict[str, Any]) -> int | None:
    """usage.prompt_tokens_details.cached_tokens as the engine reported it (None when absent)."""
    usage = response.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return cached if isinstance(cached, int) else None
