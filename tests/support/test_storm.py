"""The storm's accounting: a 200 stream that ends in an SSE error event is a failed request (a cut stream),
one that ends in [DONE] is not. The storm runs against a stand-in server that streams one of the two."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.storm import Storm, summary

CHUNK = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "tiny",
         "choices": [{"index": 0, "text": "Hel", "logprobs": None, "finish_reason": None}]}
ERROR_EVENT = {"error": {"message": "the decoder went away", "type": "ServiceUnavailableError", "param": None,
                         "code": 503}}


def serve(last_event: bytes) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b"data: " + json.dumps(CHUNK).encode() + b"\n\n" + b"data: " + last_event + b"\n\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def cutting_server() -> Iterator[str]:
    yield from serve(json.dumps(ERROR_EVENT).encode())


@pytest.fixture
def whole_server() -> Iterator[str]:
    yield from serve(b"[DONE]")


def storm_of_streams(url: str) -> list:
    storm = Storm(url, deadline_s=5, clients=2, max_requests=20, kinds={"stream": 1, "hangup_mid_stream": 1},
                  prompt_words=(3, 5)).start()
    deadline = time.monotonic() + 30
    while len(storm.outcomes) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    return storm.stop()


def test_a_stream_that_ends_in_an_error_event_is_a_failed_request(cutting_server):
    outcomes = storm_of_streams(cutting_server)
    s = summary(outcomes)
    streams = [o for o in outcomes if o.kind == "stream"]
    assert streams and all(o.status == 200 and o.cut for o in streams), s
    assert all(o.problem.startswith("cut stream: ") and "went away" in o.problem for o in streams), s
    assert s["cut_streams"] == sum(o.cut for o in outcomes) >= len(streams), s
    assert len(s["problems"]) >= s["cut_streams"], s


def test_a_stream_that_ends_in_done_is_served(whole_server):
    outcomes = storm_of_streams(whole_server)
    s = summary(outcomes)
    assert len(outcomes) >= 20 and s["cut_streams"] == 0 and not s["problems"], s
