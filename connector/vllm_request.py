"""The one place the connector edits a vLLM Request's own token lists (`_all_token_ids` is private to vLLM; the
compatibility test checks that every release we support still has it)."""

from __future__ import annotations

from typing import Any


def truncate_prompt(request: Any, keep: int) -> None:
    """P computes the first `keep` prompt tokens of a request it prefills for a decoder
    (scheduler_side.on_new_request says how many)."""
    assert 0 < keep < request.num_prompt_tokens, (keep, request.num_prompt_tokens)
    del request.prompt_token_ids[keep:]
    del request._all_token_ids[keep:]
    request.num_prompt_tokens = keep
