"""Lean fake vLLM PD workers for the proxy benchmark: one prefill and one decode endpoint in one process.

    python -m benchmarks.proxy_fake_workers P_PORT D_PORT TOKENS [INTERVAL_MS]      (binds 127.0.0.1 only)

They answer like vLLM's OpenAI server in a NIXL PD deployment, at once:
  - a request with kv_transfer_params.do_remote_decode (the prefill leg): a JSON completion of one token
    with usage and P's kv_transfer_params (do_remote_prefill, remote_engine_id, remote_block_ids, ...);
  - any other completion without stream=true (the decode leg, not streamed): one JSON completion of `TOKENS`
    tokens with usage, after TOKENS x INTERVAL_MS;
  - any other completion with stream=true (the decode leg): `TOKENS` SSE events `data: {...}\\n\\n` then
    `data: [DONE]\\n\\n`, chunked; between events the coroutine yields (INTERVAL_MS 0, the default: events
    mostly arrive in a few segments) or sleeps INTERVAL_MS, like a decoder that emits a token per step (each
    event then reaches the proxy alone);
  - GET /health: 200. Anything else: 404.

A raw asyncio protocol on uvloop rather than aiohttp (tests/proxy/fakes.py), because the workers share one
core with the load generator: the cheaper they are, the higher the harness's own ceiling (`direct` row).
"""

from __future__ import annotations

import asyncio
import sys

import msgspec
import uvloop

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()
PREFILL_KTP = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "fake-prefill-engine",
               "remote_block_ids": [[1, 2, 3, 4]], "remote_host": "127.0.0.1", "remote_port": 5600,
               "remote_request_id": "fake", "tp_size": 1}


def _response(status: str, content_type: bytes, body: bytes) -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + content_type + b"\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class Answers:
    def __init__(self, tokens: int, interval_s: float = 0.0):
        self.interval_s = interval_s
        self.health = _response("200 OK", b"application/json", b"{}")
        self.not_found = _response("404 Not Found", b"application/json", b'{"detail":"Not Found"}')
        prefill = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake-model",
                   "choices": [{"index": 0, "text": "P", "logprobs": None, "finish_reason": "length",
                                "stop_reason": None}],
                   "usage": {"prompt_tokens": 600, "total_tokens": 601, "completion_tokens": 1,
                             "prompt_tokens_details": {"cached_tokens": 0}},
                   "kv_transfer_params": PREFILL_KTP}
        self.prefill = _response("200 OK", b"application/json", _encoder.encode(prefill))
        self.stream_head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                            b"Transfer-Encoding: chunked\r\n\r\n")
        self.events = [_chunk(b"data: " + _encoder.encode(
            {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake-model",
             "choices": [{"index": 0, "text": f" t{i}", "logprobs": None, "finish_reason": None,
                          "stop_reason": None}]}) + b"\n\n") for i in range(tokens)]
        self.stream_tail = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        whole = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake-model",
                 "choices": [{"index": 0, "text": "".join(f" t{i}" for i in range(tokens)), "logprobs": None,
                              "finish_reason": "length", "stop_reason": None}],
                 "usage": {"prompt_tokens": 600, "total_tokens": 600 + tokens, "completion_tokens": tokens,
                           "prompt_tokens_details": {"cached_tokens": 592}},
                 "kv_transfer_params": None}
        self.decode_json = _response("200 OK", b"application/json", _encoder.encode(whole))


class FakeWorker(asyncio.Protocol):
    """HTTP/1.1 keep-alive, one request at a time per connection (clients here do not pipeline)."""

    def __init__(self, answers: Answers):
        self.a = answers
        self.buf = b""
        self.busy = False
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            method, path = head.split(b" ", 2)[:2]
            self._answer(method, path, body)

    def _answer(self, method: bytes, path: bytes, body: bytes) -> None:
        t = self.transport
        if method == b"GET" and path == b"/health":
            t.write(self.a.health)
            return
        if method != b"POST" or path != b"/v1/completions":
            t.write(self.a.not_found)
            return
        req = _decoder.decode(body)
        if (req.get("kv_transfer_params") or {}).get("do_remote_decode"):
            t.write(self.a.prefill)
        elif not req.get("stream"):
            if self.a.interval_s:
                self.busy = True
                asyncio.get_running_loop().create_task(self._whole())
            else:
                t.write(self.a.decode_json)
        else:
            self.busy = True
            asyncio.get_running_loop().create_task(self._stream())

    async def _whole(self) -> None:
        await asyncio.sleep(self.a.interval_s * len(self.a.events))
        if not self.transport.is_closing():
            self.transport.write(self.a.decode_json)
        self.busy = False
        self._next()

    async def _stream(self) -> None:
        t = self.transport
        t.write(self.a.stream_head)
        for event in self.a.events:
            await asyncio.sleep(self.a.interval_s)
            if t.is_closing():
                return  # the client left: vLLM aborts the request
            t.write(event)
        t.write(self.a.stream_tail)
        self.busy = False
        self._next()


async def serve(p_port: int, d_port: int, tokens: int, interval_ms: float = 0.0) -> None:
    loop = asyncio.get_running_loop()
    answers = Answers(tokens, interval_ms / 1e3)
    for port in (p_port, d_port):
        await loop.create_server(lambda: FakeWorker(answers), "127.0.0.1", port, backlog=1024)
    await asyncio.Event().wait()


if __name__ == "__main__":
    interval_ms = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    uvloop.run(serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), interval_ms))
