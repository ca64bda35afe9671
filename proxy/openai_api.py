"""The OpenAI request as the proxy sees it: parsed and type-checked once, then turned into the prefill body
and the decode body.

Only what the proxy itself relies on, and the values vLLM would answer with a 500, are checked here
(request_fields.py; a malformed body is a 400, never a crash); the semantics of sampling fields are the
worker's to judge, and its 4xx is passed through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from .errors import BadRequest
from .request_fields import check_fields

Endpoint = Literal["completions", "chat"]
PATHS: dict[Endpoint, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}

# What P gets in kv_transfer_params: "compute the prompt, keep the blocks for a remote decoder".
PREFILL_KV_TRANSFER_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

# Fields that shape only the output. P samples one token that D regenerates, so it must not pay for them
# (logprobs compile, grammar compile) nor fail on them (min_tokens > max_tokens=1, n > 1).
_OUTPUT_ONLY_FIELDS = (
    "stream_options",
    "min_tokens",
    "n",
    "best_of",
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "echo",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "guided_whitespace_pattern",
    "logit_bias",
    "suffix",
)
_OUTPUT_ONLY = frozenset(_OUTPUT_ONLY_FIELDS)
_CHAT_TOKENIZE_FIELDS = (
    "messages",
    "tools",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template",
    "chat_template_kwargs",
    "add_special_tokens",
)

_json_decoder = msgspec.json.Decoder()


@dataclass
class OpenAIRequest:
    endpoint: Endpoint
    body: dict[str, Any]
    stream: bool
    include_usage: bool
    prompt_chars: int
    token_ids: list[int] | None  # the prompt's token ids, when the client sent them or the proxy tokenized
    single_prompt: bool  # one prompt, n == 1: eligible for remote prefill (kv_transfer_params are per request)
    user: str | None

    @property
    def path(self) -> str:
        return PATHS[self.endpoint]

    @property
    def model(self) -> str | None:
        m = self.body.get("model")
        return m if isinstance(m, str) else None

    def tokenize_body(self) -> dict[str, Any] | None:
        """Body for the worker's POST /tokenize, or None when the prompt cannot be tokenized that way."""
        if self.endpoint == "chat":
            out = {k: self.body[k] for k in _CHAT_TOKENIZE_FIELDS if k in self.body}
        elif isinstance(self.body.get("prompt"), str):
            out = {"prompt": self.body["prompt"]}
            if "add_special_tokens" in self.body:
                out["add_special_tokens"] = self.body["add_special_tokens"]
        else:
            return None
        if self.model:
            out["model"] = self.model
        return out

    def prefill_body(self, forward_token_ids: bool) -> dict[str, Any]:
        body = self._worker_body(forward_token_ids)  # (a copy of its own)
        for k in _OUTPUT_ONLY.intersection(body):
            del body[k]
        body["max_tokens"] = 1
        if self.endpoint == "chat":
            body["max_completion_tokens"] = 1
        body["stream"] = False
        body["kv_transfer_params"] = dict(PREFILL_KV_TRANSFER_PARAMS)
        return body

    def decode_body(self, kv_transfer_params: dict[str, Any] | None, forward_token_ids: bool) -> dict[str, Any]:
        body = self._worker_body(forward_token_ids)
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        return body

    def _worker_body(self, forward_token_ids: bool) -> dict[str, Any]:
        body = dict(self.body)
        body.pop("kv_transfer_params", None)  # the proxy owns the PD protocol; a client must not steer it
        if (
            forward_token_ids
            and self.endpoint == "completions"
            and self.token_ids
            and isinstance(body.get("prompt"), str)
        ):
            body["prompt"] = self.token_ids  # workers skip tokenizing, and hash exactly what routing scored
            body.pop("add_special_tokens", None)
        return body


def check_content_type(content_type: str | None) -> None:
    """As vLLM's server does: a body that does not say it is JSON is refused, whatever it holds."""
    if content_type == "application/json":  # what clients send (the general check splits and lowers)
        return
    if (content_type or "").split(";", 1)[0].strip().lower() != "application/json":
        raise BadRequest("Unsupported Media Type: Only 'application/json' is allowed")


def parse_request(endpoint: Endpoint, raw: bytes) -> OpenAIRequest:
    try:
        body = _json_decoder.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:  # msgspec reports bad UTF-8 in a string this way
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_NESTING and _nesting(body) > MAX_NESTING:
        # msgspec decodes deeper than it can encode again from the stack the request runs on: refuse it here
        raise BadRequest(f"request body is nested too deeply (more than {MAX_NESTING} levels)")
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    check_fields(body)
    stream = bool(body.get("stream", False))
    _check_output_fields(body, endpoint, stream)
    include_usage = stream and bool((body.get("stream_options") or {}).get("include_usage", False))
    n = body.get("n", 1)
    if endpoint == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise BadRequest("'messages' must be a non-empty array of message objects", param="messages")
        chars = sum(_content_chars(m.get("content")) for m in msgs)
        token_ids, single = None, True
    else:
        prompt = body.get("prompt")
        token_ids, chars, single = _parse_prompt(prompt)
    return OpenAIRequest(
        endpoint,
        body,
        stream,
        include_usage,
        chars,
        token_ids,
        single and n in (1, None) and body.get("best_of") in (1, None),
        body.get("user"),
    )


MAX_NESTING = 256  # levels of arrays and objects a body may nest (no OpenAI request needs more)


def _nesting(obj: Any) -> int:
    """How deep arrays and objects nest in a decoded body, without recursion."""
    deepest, todo = 0, [(obj, 1)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            deepest = max(deepest, depth)
            todo.extend((child, depth + 1) for child in node if isinstance(child, (dict, list)))
    return deepest


def _check_output_fields(body: dict[str, Any], endpoint: Endpoint, stream: bool) -> None:
    """Fields P never sees (they shape only the output) are judged by D alone, after P computed the prompt and
    leased its blocks: the cheap part of D's judgement is made here, before P is called, in vLLM's words. Only
    values vLLM refuses are refused (a value of another type is left to D, whose parser may coerce it)."""
    if _OUTPUT_CHECKED.isdisjoint(body):  # (each check below needs one of these fields; most requests have none)
        return
    n, best_of, min_tokens = _int(body, "n"), _int(body, "best_of"), _int(body, "min_tokens")
    if body.get("stream_options") is not None and not stream:
        raise BadRequest("Stream options can only be defined when `stream=True`.", param="stream_options")
    if n is not None and n < 1:
        raise BadRequest(f"n must be at least 1, got {n}.", param="n")
    if best_of is not None and best_of < (n or 1):
        raise BadRequest(
            f"best_of must be greater than or equal to n, got n={n or 1} and best_of={best_of}.", param="best_of"
        )
    cap = _int(body, "max_completion_tokens") if endpoint == "chat" else None
    cap = _int(body, "max_tokens") if cap is None else cap
    if min_tokens is not None and min_tokens < 0:
        raise BadRequest(f"min_tokens must be greater than or equal to 0, got {min_tokens}.", param="min_tokens")
    if min_tokens is not None and cap is not None and min_tokens > cap:
        raise BadRequest(
            f"min_tokens must be less than or equal to max_tokens={cap}, got {min_tokens}.", param="min_tokens"
        )
    top = _int(body, "top_logprobs")
    if endpoint == "chat" and top is not None and (top < 0 or not body.get("logprobs")):
        raise BadRequest(
            "when using `top_logprobs`, `logprobs` must be set to true and `top_logprobs` must "
            "be a non-negative integer.",
            param="top_logprobs",
        )
    logprobs = _int(body, "logprobs")
    if endpoint == "completions" and logprobs is not None and logprobs < 0:
        raise BadRequest("`logprobs` must be a non-negative value.", param="logprobs")


_OUTPUT_CHECKED = frozenset(("stream_options", "n", "best_of", "min_tokens", "top_logprobs", "logprobs"))


def _int(body: dict[str, Any], name: str) -> int | None:
    v = body.get(name)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _token_ids(x: Any) -> list[int] | None:
    """`x` as token ids (a list of its own), or None where it is not an array of integers (a boolean is not one).
    msgspec checks the elements in C: 9,181 ids took 0.52-0.54 ms with a Python generator, 0.035 ms so, on the
    CPU bed (benchmarks/results/2026-11-27-cpu-proxy-parse)."""
    if not isinstance(x, list):
        return None
    try:
        return msgspec.convert(x, list[int], strict=True)
    except msgspec.ValidationError:
        return None


def _parse_prompt(prompt: Any) -> tuple[list[int] | None, int, bool]:
    """(token ids if given as ids, characters of text, is one prompt)."""
    if isinstance(prompt, str):
        return None, len(prompt), True
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest("'prompt' must be a string, an array of strings, or an array of token ids", param="prompt")
    if ids := _token_ids(prompt):
        return ids, 0, True
    if all(isinstance(p, str) for p in prompt):
        return None, sum(map(len, prompt)), len(prompt) == 1
    lists = [_token_ids(p) for p in prompt]
    if all(lists):  # each a non-empty array of token ids
        return (lists[0] if len(lists) == 1 else None), 0, len(lists) == 1
    raise BadRequest("'prompt' must be a string, an array of strings, or an array of token ids", param="prompt")


def _content_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p.get("text", "")) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0
