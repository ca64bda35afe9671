"""Fake vLLM workers for the proxy tests: small aiohttp apps on 127.0.0.1 that answer like vLLM's OpenAI server
in a PD deployment (kv_transfer_params, usage with prompt_tokens_details, SSE streaming), and that can be told
to fail in every way the proxy must survive."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from hybrid_pd.connector.contract import AWAIT_PREFILL
from hybrid_pd.proxy.app import RunningProxy, serve_in_background
from hybrid_pd.proxy.config import ProxyConfig, WorkerSpec


def tokens_of(text: str) -> list[int]:
    """The fake tokenizer: one token per character."""
    return [ord(c) for c in text]


@dataclass
class Seen:
    path: str
    body: dict[str, Any]
    headers: Any  # case-insensitive


@dataclass
class FakeWorker:
    role: str
    status: int = 200  # answer this status on the generate endpoints
    error_body: Any = None  # JSON body for status >= 400 (default: vLLM's OpenAI-shaped error)
    hang: bool = False  # generate endpoints wait for `release` (never set unless a test sets it)
    hang_stream_after_first: bool = False  # stream one chunk, then wait for `release`
    return_ktp: bool = True  # a prefiller returns kv_transfer_params
    extra_ktp: dict[str, Any] = field(default_factory=dict)  # added to a prefiller's kv_transfer_params
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens this worker reports
    model_root: str = "fake-model"  # what /v1/models names as the model's id and root (a folder or a Hub id)
    healthy: bool = True
    chunks: tuple[str, ...] = ("Hel", "lo")
    seen: list[Seen] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    received: asyncio.Event = field(default_factory=asyncio.Event)  # a generate request arrived
    finished: asyncio.Event = field(default_factory=asyncio.Event)  # a generate handler ran to its end
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)  # a generate handler lost its client
    url: str = ""
    running: int = 0  # generate requests being answered: what /metrics reports, as vLLM's num_requests_running
    kv_usage: float = 0.0
    # early decode: a decoder's params inbox (connector/params_inbox.py); a request that carries a transfer key
    # waits (5 s at most) for its outcome there before it answers, and `outcomes` keeps what arrived by key
    inbox: Any = None
    outcomes: dict[str, Any] = field(default_factory=dict)
    _inbox_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _runner: web.AppRunner | None = None

    @property
    def generate_calls(self) -> list[Seen]:
        return [s for s in self.seen if s.path.startswith("/v1/") and s.path != "/v1/models"]

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            self.release.set()
            await self._runner.cleanup()
            self._runner = None

    # ---- handlers ----------------------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 500)

    async def _metrics(self, request: web.Request) -> web.Response:
        labels = '{engine="0",model_name="fake-model"}'
        return web.Response(text=f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{labels} "
                                 f"{float(self.running)}\nvllm:num_requests_waiting{labels} 0.0\n"
                                 f"vllm:kv_cache_usage_perc{labels} {self.kv_usage}\n")

    async def _models(self, request: web.Request) -> web.Response:
        self.seen.append(Seen(request.path, {}, request.headers.copy()))
        return web.json_response({"object": "list", "data": [{"id": self.model_root, "root": self.model_root,
                                                              "object": "model", "created": 0,
                                                              "owned_by": self.role}]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append(Seen(request.path, body, request.headers.copy()))
        messages = body.get("messages")
        text = "".join(str(m.get("content", "")) for m in messages) if messages is not None else body["prompt"]
        toks = tokens_of(text)
        return web.json_response({"count": len(toks), "max_model_len": 4096, "tokens": toks})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(Seen(request.path, body, request.headers.copy()))
        self.received.set()
        self.running += 1
        try:
            key = (body.get("kv_transfer_params") or {}).get(AWAIT_PREFILL)
            if key is not None and self.inbox is not None:
                await self._await_outcome(key)
            if self.hang:
                await self.release.wait()
            if self.status >= 400:
                return web.json_response(self.error_body or {"error": {
                    "message": f"fake {self.role} says {self.status}", "type": "BadRequestError",
                    "param": None, "code": self.status}}, status=self.status)
            chat = request.path.endswith("chat/completions")
            prompt_tokens = self._prompt_tokens(body, chat)
            if body.get("stream"):
                return await self._stream(request, body, chat, prompt_tokens)
            return web.json_response(self._whole(body, chat, prompt_tokens))
        except asyncio.CancelledError:
            self.client_gone.set()
            raise
        finally:
            self.running -= 1
            self.finished.set()

    async def _await_outcome(self, key: str) -> None:
        deadline = asyncio.get_running_loop().time() + 5
        while key not in self.outcomes and asyncio.get_running_loop().time() < deadline:
            async with self._inbox_lock:  # one thread at a time on the ZMQ socket
                if key not in self.outcomes:
                    for outcome in await asyncio.to_thread(self.inbox.drain, 0.05):
                        self.outcomes[outcome.key] = outcome

    def _prompt_tokens(self, body: dict[str, Any], chat: bool) -> int:
        if chat:
            return len("".join(str(m.get("content", "")) for m in body["messages"]))
        p = body["prompt"]
        return len(p) if isinstance(p, (str, list)) else 0

    def _usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}

    def _whole(self, body: dict[str, Any], chat: bool, prompt_tokens: int) -> dict[str, Any]:
        prefill = bool((body.get("kv_transfer_params") or {}).get("do_remote_decode"))
        text = "P" if prefill else "".join(self.chunks)
        n_out = 1 if prefill else len(self.chunks)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": "length"}
            out = {"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake-model",
                   "choices": [choice]}
        else:
            out = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake-model",
                   "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}]}
        out["usage"] = self._usage(prompt_tokens, n_out)
        if prefill and self.return_ktp:
            out["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                         "remote_engine_id": f"engine-{self.url}", "remote_block_ids": [[1, 2], [0, 7]],
                                         "remote_host": "127.0.0.1", "remote_port": 5600,
                                         "remote_request_id": "r-1", "tp_size": 1, **self.extra_ktp}
        else:
            out["kv_transfer_params"] = None
        return out

    async def _stream(self, request: web.Request, body: dict[str, Any], chat: bool,
                      prompt_tokens: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i, piece in enumerate(self.chunks):
            if chat:
                chunk = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                         "model": "fake-model", "choices": [{"index": 0, "delta": {"content": piece},
                                                             "logprobs": None, "finish_reason": None}]}
            else:
                chunk = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake-model",
                         "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if i == 0 and self.hang_stream_after_first:
                await self.release.wait()
        if (body.get("stream_options") or {}).get("include_usage"):
            obj = "chat.completion.chunk" if chat else "text_completion"
            chunk = {"id": "x", "object": obj, "created": 0, "model": "fake-model", "choices": [],
                     "usage": self._usage(prompt_tokens, len(self.chunks))}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


@dataclass
class Cluster:
    proxy: RunningProxy
    prefill: list[FakeWorker]
    decode: list[FakeWorker]

    @property
    def url(self) -> str:
        return self.proxy.url

    @property
    def state(self):
        return self.proxy.state

    @property
    def p(self) -> FakeWorker:
        return self.prefill[0]

    @property
    def d(self) -> FakeWorker:
        return self.decode[0]


@contextlib.asynccontextmanager
async def cluster(n_prefill: int = 1, n_decode: int = 1, **options: Any) -> AsyncIterator[Cluster]:
    """Fake workers plus a proxy in front of them (health checks and load reads off unless `health_interval` or
    `load_interval` is given: tests count the proxy's connections to the workers)."""
    root = options.pop("model_root", "fake-model")  # what the workers' /v1/models name
    prefill = [FakeWorker("prefill", model_root=root) for _ in range(n_prefill)]
    decode = [FakeWorker("decode", model_root=root) for _ in range(n_decode)]
    try:
        for w in prefill + decode:
            await w.start()
        flat = {"port": 0, "prefill": [w.url for w in prefill], "decode": [w.url for w in decode],
                "health_interval": 0, "load_interval": 0, **options}
        config = ProxyConfig.from_flat(flat)
        async with serve_in_background(config) as proxy:
            yield Cluster(proxy, prefill, decode)
    finally:
        for w in prefill + decode:
            await w.stop()


def specs(*urls: str) -> tuple[WorkerSpec, ...]:
    return tuple(WorkerSpec(u) for u in urls)


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of a sample's values in Prometheus text whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, rest = head.partition("{")
        if sample != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += float(value)
    return total


def run(coro: Any, timeout: float = 20.0) -> Any:
    """Run one test coroutine with a hard deadline (a hang fails the test instead of stalling the suite)."""
    return asyncio.run(asyncio.wait_for(coro, timeout))
