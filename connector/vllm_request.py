"""The one place the connector edits a vLLM Request's own token lists (`_all_token_ids` is private to vLLM; the
compatibility test checks that every release we support still has it)."""

from __future__ import annotations

from typing import Any


def drop_last_prompt_token(request: Any) -> None:
    """P computes N-1 prompt tokens of a request it prefills for a decoder (scheduler_side.on_new_request)."""
    del request.prompt_token_ids[-1]
    del request._all_token_ids[-1]
    request.num_prompt_tokens -= 1
