"""The prompt's token ids computed in the proxy, with the model's own tokenizer and chat template, as vLLM 0.32's
renderer computes them, instead of a POST /tokenize to a worker per routed request.

    LocalTokenizer.load(folder)      the model's Hugging Face tokenizer (transformers.AutoTokenizer, as vLLM loads it)
    .tokens(request) -> ids | None   None: a request shape this module does not reproduce exactly (the caller asks
                                     a worker's /tokenize instead)
    .last_message_start(request, ids) -> int | None   chat: the tokens before the last message (a junction: where
                                     an agent loop's next turn, which drops a fixed last instruction, diverges)

What vLLM does, and what is reproduced here:
- completions, a string prompt: `tokenizer.encode(prompt, add_special_tokens=...)` (default True);
- chat: the messages become a "conversation" (content parts parsed, tool calls and reasoning kept, developer
  roles folded, Claude Code's billing header dropped), then `apply_chat_template(conversation, tokenize=True,
  add_generation_prompt, continue_final_message, documents, **chat_template_kwargs)`. Reproduced: messages of
  the roles system, user and assistant whose content is a string or one text part (the same text in both of
  vLLM's content formats, checked at load), with an optional `name`; `chat_template_kwargs` that are template
  variables. Everything else (tools, tool calls, reasoning, images, several parts, a request's own template,
  truncation) is answered None.

The workers must render with the same template: a worker started with its own `--chat-template` or
`--default-chat-template-kwargs` needs `--tokenizer remote` on the proxy (the workers' /tokenize).
"""

from __future__ import annotations

import inspect
import logging
import re
from typing import Any

from .openai_api import OpenAIRequest

log = logging.getLogger("hybrid_pd.proxy")

_CHAT_ROLES = frozenset({"system", "user", "assistant"})
_MESSAGE_KEYS = frozenset({"role", "content", "name"})
# Request fields that change what vLLM renders in a way not reproduced here (their presence sends the request
# to a worker's /tokenize): a request's own template, tools, documents, reasoning settings, truncation, media.
_CHAT_FIELDS_NOT_REPRODUCED = (
    "tools",
    "chat_template",
    "documents",
    "reasoning_effort",
    "truncate_prompt_tokens",
    "mm_processor_kwargs",
    "media_io_kwargs",
)
_COMPLETION_FIELDS_NOT_REPRODUCED = ("truncate_prompt_tokens", "prompt_embeds")
_BILLING_HEADER = "x-anthropic-billing-header"  # a system text that starts with it loses its first line in vLLM


class LocalTokenizer:
    def __init__(self, tokenizer: Any, source: str):
        self.tokenizer = tokenizer
        self.source = source
        template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
        # Keyword arguments of apply_chat_template itself (return_dict, padding, ...): in chat_template_kwargs they
        # would change the call, not the template's variables.
        self._call_params = frozenset(inspect.signature(tokenizer.apply_chat_template).parameters)
        self.chat = template is not None and _string_content_renders_as_vllm(tokenizer, template)
        if template is not None and not self.chat:
            log.info(
                "local tokenizer %s: its chat template takes content as a list of parts: chat requests are "
                "tokenized through the workers' /tokenize",
                source,
            )

    @classmethod
    def load(cls, source: str, local_only: bool = False) -> LocalTokenizer:
        """The tokenizer of the model folder (or Hugging Face id) `source`; raises what transformers raises.
        `local_only`: an id is read from the Hugging Face cache on this machine (HF_HOME), never downloaded."""
        from transformers import AutoTokenizer  # seconds to import: only a proxy that tokenizes pays it

        return cls(AutoTokenizer.from_pretrained(source, local_files_only=local_only), source)

    def tokens(self, request: OpenAIRequest) -> list[int] | None:
        body = request.body
        if request.endpoint == "completions":
            prompt = body.get("prompt")
            if not isinstance(prompt, str) or any(body.get(k) is not None for k in _COMPLETION_FIELDS_NOT_REPRODUCED):
                return None
            special = body.get("add_special_tokens", True)
            if not isinstance(special, bool):
                return None
            return list(self.tokenizer.encode(prompt, add_special_tokens=special))
        return self._chat_tokens(body)

    def last_message_start(self, request: OpenAIRequest, ids: list[int]) -> int | None:
        """Chat: how many of the prompt's tokens `ids` (this module's, or vLLM's: the same) precede its last
        message, i.e. the earlier messages as the template renders them, where that rendering is a prefix of the
        whole (a template that renders earlier messages by what follows them is not: None). None for completions,
        a single message, or a request shape `tokens` does not reproduce."""
        body = request.body
        if request.endpoint != "chat" or len(body.get("messages") or ()) < 2:
            return None
        rendered = self._chat_tokens(body, earlier_only=True)
        if rendered is None or not 0 < len(rendered) < len(ids) or ids[: len(rendered)] != rendered:
            return None
        return len(rendered)

    def _chat_tokens(self, body: dict[str, Any], earlier_only: bool = False) -> list[int] | None:
        if not self.chat or any(body.get(k) is not None for k in _CHAT_FIELDS_NOT_REPRODUCED):
            return None
        if body.get("add_special_tokens", False) is not False:
            return None
        conversation = _conversation(body["messages"])
        if conversation is None:
            return None
        kwargs = body.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict) or any(k in self._call_params or k == "tokenize" for k in kwargs):
            return None
        generation, cont = body.get("add_generation_prompt", True), body.get("continue_final_message", False)
        if not isinstance(generation, bool) or not isinstance(cont, bool) or (generation and cont):
            return None  # vLLM refuses both at once (a 400 from the worker)
        if earlier_only:  # every message but the last, closed as the template closes a message
            conversation, generation, cont = conversation[:-1], False, False
        ids = self.tokenizer.apply_chat_template(
            conversation,
            tokenize=True,
            return_dict=False,
            add_generation_prompt=generation,
            continue_final_message=cont,
            **kwargs,
        )
        return list(ids)


def _conversation(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """vLLM's conversation for plain text messages (its parse gives the same for these); None for any other."""
    out = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        if role not in _CHAT_ROLES or not _MESSAGE_KEYS.issuperset(m):
            return None
        if isinstance(content, list):
            if len(content) != 1 or not isinstance(content[0], dict) or set(content[0]) != {"type", "text"}:
                return None
            if content[0]["type"] != "text":
                return None
            content = content[0]["text"]
        if not isinstance(content, str) or (role == "system" and content.startswith(_BILLING_HEADER)):
            return None
        message = {"role": role, "content": content}
        if "name" in m:
            if not isinstance(m["name"], str):
                return None
            message["name"] = m["name"]
        out.append(message)
    return out


_LOOP_OVER_CONTENT = re.compile(r"for\s+\w+\s+in\s+[\w.]*(content\b|\[\s*['\"]content['\"]\s*\])")


def _string_content_renders_as_vllm(tokenizer: Any, template: str) -> bool:
    """vLLM hands a template each message's content as a string, or as a list of parts where it finds a loop
    over the content in the template; this module passes a string. True where that renders what vLLM renders:
    the template has no such loop, or it renders both forms the same."""
    if not _LOOP_OVER_CONTENT.search(template):
        return True
    probes = ["probe one", "line\nbreak"]
    as_text = [{"role": r, "content": t} for r, t in zip(("system", "user"), probes)]
    as_parts = [{"role": r, "content": [{"type": "text", "text": t}]} for r, t in zip(("system", "user"), probes)]
    try:
        a = tokenizer.apply_chat_template(as_text, tokenize=False, add_generation_prompt=True)
        b = tokenizer.apply_chat_template(as_parts, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that refuses one of the shapes: chat goes through the workers' /tokenize
        return False
    return bool(a == b)
