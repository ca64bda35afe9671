"""The least a Python proxy on uvicorn does for the PD flow: the floor under our proxy's CPU per request.

    python -m benchmarks.proxy_floor --port PORT --prefill URL --decode URL      (what proxy_ab --floor starts)

uvicorn's httptools protocol with a bare ASGI callable (no routing, no metrics, no checks, no usage fixing) and
our HTTP client to the workers (proxy/http/client.py): decode the body, P with max_tokens=1 and
kv_transfer_params, D with P's kv_transfer_params, D's answer copied back as it comes. Not a proxy to serve
anything with: a measure of what the server, the client and the interpreter cost before any of the proxy's own
work, so that a cell where this alone spends more CPU per request than a peer names the cost our code cannot
remove while the proxy serves on uvicorn.
"""

from __future__ import annotations

import argparse
from typing import Any

import msgspec
import uvicorn

from hybrid_pd.proxy.http.client import HTTPPool
from hybrid_pd.proxy.openai_api import PREFILL_KV_TRANSFER_PARAMS

_decoder, _encoder = msgspec.json.Decoder(), msgspec.json.Encoder()
JSON = {"Content-Type": "application/json"}
PREFILL = PREFILL_KV_TRANSFER_PARAMS  # what the proxy sends P


def app_for(prefill: str, decode: str) -> Any:
    pool = HTTPPool(connect_timeout=5.0)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/health":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": b"{}"})
            return
        message = await receive()
        body = _decoder.decode(message["body"])
        p_body = dict(body, max_tokens=1, stream=False, kv_transfer_params=PREFILL)
        resp = await pool.request("POST", prefill, scope["path"], _encoder.encode(p_body), JSON, timeout=30)
        params = _decoder.decode(await resp.read(30)).get("kv_transfer_params")
        resp = await pool.request(
            "POST", decode, scope["path"], _encoder.encode(dict(body, kv_transfer_params=params)), JSON, timeout=30
        )
        if not body.get("stream"):
            data = await resp.read(30)
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))],
                }
            )
            await send({"type": "http.response.body", "body": data})
            return
        await send(
            {"type": "http.response.start", "status": resp.status, "headers": [(b"content-type", b"text/event-stream")]}
        )
        while data := await resp.readany(30):
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--prefill", required=True)
    ap.add_argument("--decode", required=True)
    args = ap.parse_args()
    uvicorn.run(
        app_for(args.prefill, args.decode),
        host="127.0.0.1",
        port=args.port,
        http="httptools",
        loop="uvloop",
        interface="asgi3",
        lifespan="off",
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
    )


if __name__ == "__main__":
    main()
