"""The token ids of a turn's prompt, for routing and placement (pd_flow.py's step 1), and where its last message
starts (the junction P stops at: the state there crosses for the conversation's next turn to diverge from).

From the proxy's own tokenizer (proxy/tokenizer.py) where it is loaded and reproduces the request's shape, else from
a worker's /tokenize; None where neither gives them (the request is routed without ids).
"""

from __future__ import annotations

import asyncio
import logging
import time

from .errors import UpstreamError, UpstreamStatus
from .kv.groups import aligned_block
from .metrics import FlowRecorder
from .placement.cost_model import remote_tail
from .state import ProxyState
from .timers import time_left
from .turn import Turn

log = logging.getLogger("hybrid_pd.proxy")
# Prompts longer than this are tokenized in a thread (a 9k-token prompt takes milliseconds that other requests'
# streams would wait for on the event loop); shorter ones cost less inline than the thread's hand-over.
INLINE_TOKENIZE_CHARS = 8192


class TurnTokens:
    def __init__(self, state: ProxyState, record: FlowRecorder):
        self.state, self.record = state, record

    async def ids(self, turn: Turn, loop: asyncio.AbstractEventLoop) -> list[int] | None:
        """The prompt's ids: from the proxy's own tokenizer where it is loaded and reproduces the request's shape,
        else from a worker's /tokenize (None where neither gives them: the request is routed without ids)."""
        tokenizer = self.state.tokenizer
        if tokenizer is not None:
            began = time.perf_counter()
            try:
                if turn.body.prompt_chars > INLINE_TOKENIZE_CHARS:  # milliseconds: off the event loop
                    tokens = await asyncio.to_thread(tokenizer.tokens, turn.body)
                else:
                    tokens = tokenizer.tokens(turn.body)
            except Exception as e:  # the template refused the messages: the worker's /tokenize says why (a 4xx)
                log.info("local tokenization failed (%r): asking a worker's /tokenize", e)
                tokens = None
            if tokens is not None:
                self.record.stage("tokenize", time.perf_counter() - began)
                self.record.tokenized("local")
                return tokens
        tokens = await self._remote(turn, loop)
        self.record.tokenized("failed" if tokens is None else "remote")
        return tokens

    async def junction(self, turn: Turn) -> int | None:
        """Where the prompt's last message starts, as P's stop (a token position: P stops at the block boundary at
        or below it and its state there crosses for D to keep), where that boundary lies below the stop the
        placement chose; None otherwise (no local tokenizer, a shape it does not reproduce, a short history)."""
        tokenizer, ids, placement = self.state.tokenizer, turn.context.token_ids, turn.placement
        if tokenizer is None or not ids or placement is None:
            return None
        block = aligned_block(self.state.kv_index.specs)
        try:
            if turn.body.prompt_chars > INLINE_TOKENIZE_CHARS:  # milliseconds: off the event loop
                at = await asyncio.to_thread(tokenizer.last_message_start, turn.body, ids)
            else:
                at = tokenizer.last_message_start(turn.body, ids)
        except Exception as e:  # the template refused the shorter conversation: the placement's stop stands
            log.info("no junction for %s: %r", turn.headers.get("X-Request-Id"), e)
            return None
        n = len(ids)
        if at is None or block <= 0 or not block <= at // block * block < n - remote_tail(n, block, placement.stop):
            return None
        self.record.junction_stop()
        return at

    async def _remote(self, turn: Turn, loop: asyncio.AbstractEventLoop) -> list[int] | None:
        body = turn.body.tokenize_body()
        workers = self.state.pool.admitted("decode") or self.state.pool.admitted("prefill")
        if body is None or not workers:
            return None
        worker = workers[hash(turn.headers["X-Request-Id"]) % len(workers)]
        began = time.perf_counter()
        try:
            timeout = min(self.state.config.timeouts.tokenize_s, time_left(loop, turn.deadline))
            answer = await self.state.upstream.post_json(
                worker.url, "/tokenize", body, timeout=timeout, stage="tokenize", headers=turn.headers
            )
        except UpstreamStatus as e:
            if e.is_client_error and turn.body.endpoint == "chat":
                raise  # the chat template refused the messages: the client's request is at fault
            log.info("tokenize on %s failed (%s): routing without token ids", worker.url, e)
            return None
        except UpstreamError as e:
            log.info("tokenize on %s failed (%s): routing without token ids", worker.url, e)
            return None
        finally:
            self.record.stage("tokenize", time.perf_counter() - began)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if isinstance(tokens, list) and all(isinstance(x, int) for x in tokens):
            return tokens
        return None
