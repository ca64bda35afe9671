"""A storm of clients against the proxy: completions, streams, clients that hang up at random points and
malformed bodies, from a few threads, bounded in count and time. Each request's outcome is kept for the
assertions of the chaos suite and the figures of the soak benchmark.

Clients speak plain HTTP/1.1 over their own sockets (http.client), so a hang-up is a real close of the
connection at the point drawn: before the answer, or after a few events of a stream.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from tests.support.conversation import text_of

KINDS = {"complete": 3, "stream": 3, "hangup_early": 2, "hangup_mid_stream": 2, "malformed": 1}
SOAK_KINDS = {**KINDS, "conversation_turn": 4}  # + multi-turn conversations that grow turn by turn
PROXY_FAULTS = (502, 503, 504)  # what a client may get when a worker is down or slow: never another 5xx
MALFORMED = (b'{"model": "tiny", "prompt": "\xff\xfe", "max_tokens": 2}', b'{"model": "tiny", "prompt": ',
             b'[1, 2, 3]', b'{"model": "tiny", "prompt": "x", "max_tokens": "many"}',
             b'{"model": "tiny", "prompt": "x", "extra": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
             b'{"model": "tiny", "messages": "not a list"}')


@dataclass
class Outcome:
    kind: str
    started: float  # time.monotonic() at the request's start
    seconds: float  # until the answer ended, the client hung up, or the socket timed out
    status: int | None = None  # None: the client hung up before a status line, or never got one
    problem: str = ""  # what a demanding client would complain of ("" when the answer was right)
    cut: bool = False  # a 200 stream that ended with an SSE error event: a failure (its problem says so)


@dataclass
class Storm:
    """`clients` threads send requests to `url` until `stop()` or `max_requests`; `deadline_s` is the proxy's
    total timeout: an answer that takes longer than it plus a little is a problem, one that never ends too."""

    url: str
    deadline_s: float
    seed: int = 0
    clients: int = 3
    max_requests: int = 2000
    prompt_words: tuple[int, int] = (30, 400)
    kinds: dict[str, int] = field(default_factory=lambda: dict(KINDS))
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(self.seed * 100 + i,), daemon=True)
                         for i in range(self.clients)]
        self._host, self._port = urlsplit(self.url).hostname, urlsplit(self.url).port
        self._local = threading.local()  # each client's conversation so far

    def start(self) -> Storm:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for t in self._threads:
            t.join(self.deadline_s + 30)
        assert not any(t.is_alive() for t in self._threads), "a storm client hangs past the proxy's deadline"
        return self.outcomes

    def __enter__(self) -> Storm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- one client ------------------------------------------------------------------------------------
    def _client(self, seed: int) -> None:
        rng = random.Random(seed)
        self._local.history = ""
        kinds, weights = zip(*self.kinds.items())
        while not self._stop.is_set():
            with self._lock:
                if len(self.outcomes) >= self.max_requests:
                    return
            kind = rng.choices(kinds, weights)[0]
            out = Outcome(kind, time.monotonic(), 0.0)
            try:
                getattr(self, "_" + kind)(rng, out)
            except (OSError, http.client.HTTPException) as e:
                out.problem = out.problem or f"{type(e).__name__}: {e}"
            out.seconds = time.monotonic() - out.started
            if out.status in PROXY_FAULTS:
                self._stop.wait(rng.uniform(0.2, 0.5))  # as a client backs off before trying again
            if out.seconds > self.deadline_s + 10:
                out.problem = out.problem or f"took {out.seconds:.1f} s, past the {self.deadline_s:g} s deadline"
            with self._lock:
                self.outcomes.append(out)

    def _connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self._host, self._port, timeout=self.deadline_s + 10)

    def _body(self, rng: random.Random, stream: bool) -> bytes:
        words = rng.randint(*self.prompt_words)
        return json.dumps({"model": "tiny", "prompt": text_of(words, rng.randrange(1 << 30)),
                           "max_tokens": rng.randint(2, 12), "temperature": 0.0, "ignore_eos": True,
                           "stream": stream}).encode()

    def _send(self, conn: http.client.HTTPConnection, body: bytes) -> None:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})

    def _complete(self, rng: random.Random, out: Outcome) -> None:
        conn = self._connect()
        try:
            self._send(conn, self._body(rng, stream=False))
            resp = conn.getresponse()
            out.status, raw = resp.status, resp.read()
            out.problem = answer_problem(resp.status, raw)
        finally:
            conn.close()

    def _stream(self, rng: random.Random, out: Outcome, hang_up_after: int | None = None) -> None:
        conn = self._connect()
        try:
            self._send(conn, self._body(rng, stream=True))
            resp = conn.getresponse()
            out.status = resp.status
            if resp.status != 200:
                out.problem = answer_problem(resp.status, resp.read())
                return
            events = 0
            for line in resp:  # SSE: "data: {...}" lines; the stream ends with [DONE] or an error event
                if not line.startswith(b"data: "):
                    continue
                events += 1
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    return
                if b'"error"' in payload and "error" in json.loads(payload):
                    out.cut = True  # the client got a 200 and then no answer: a failed request
                    event = json.loads(payload)
                    out.problem = f"cut stream: {error_shape_problem(event) or event['error']['message']!s:.200}"
                    return
                if hang_up_after is not None and events >= hang_up_after:
                    return  # the client leaves mid-stream (finally: its socket closes)
            out.problem = "the stream ended without [DONE] or an error event"
        finally:
            conn.close()

    def _conversation_turn(self, rng: random.Random, out: Outcome) -> None:
        """The next turn of this client's conversation: everything so far + the answer + new words; a new
        conversation after ~700 words (the engines' context is 2,048 tokens)."""
        if len(self._local.history.split()) > 700:
            self._local.history = ""
        prompt = self._local.history + " " + text_of(rng.randint(20, 200), rng.randrange(1 << 30))
        conn = self._connect()
        try:
            conn.request("POST", "/v1/completions", json.dumps(
                {"model": "tiny", "prompt": prompt.strip(), "max_tokens": 8, "temperature": 0.0,
                 "ignore_eos": True}).encode(), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            out.status, raw = resp.status, resp.read()
            out.problem = answer_problem(resp.status, raw)
            if resp.status == 200:
                self._local.history = prompt + json.loads(raw)["choices"][0]["text"]
        finally:
            conn.close()

    def _hangup_mid_stream(self, rng: random.Random, out: Outcome) -> None:
        self._stream(rng, out, hang_up_after=rng.randint(1, 3))

    def _hangup_early(self, rng: random.Random, out: Outcome) -> None:
        """Send a request, wait a moment (often less than its prefill), and close the connection unread."""
        sock = socket.create_connection((self._host, self._port), timeout=10)
        try:
            body = self._body(rng, stream=rng.random() < 0.5)
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            time.sleep(rng.uniform(0.0, 0.4))
        finally:
            sock.close()

    def _malformed(self, rng: random.Random, out: Outcome) -> None:
        conn = self._connect()
        try:
            conn.request("POST", "/v1/completions", rng.choice(MALFORMED), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            out.status, raw = resp.status, resp.read()
            out.problem = error_shape_problem(json.loads(raw)) if resp.status == 400 else \
                f"a malformed body got {resp.status}, not 400: {raw[:200]!r}"
        finally:
            conn.close()


def answer_problem(status: int, raw: bytes) -> str:
    if status == 200:
        return "" if json.loads(raw).get("choices") else f"a 200 without choices: {raw[:200]!r}"
    if status not in PROXY_FAULTS:
        return f"status {status}: {raw[:200]!r}"
    return error_shape_problem(json.loads(raw))


def error_shape_problem(body: dict) -> str:
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or set(err) != {"message", "type", "param", "code"}:
        return f"not an OpenAI error body: {body!r:.200}"
    return ""


def summary(outcomes: list[Outcome]) -> dict:
    """Counts by kind and status, the worst latency, and the problems (for assertion messages and reports)."""
    answered = [o.seconds for o in outcomes if o.kind != "hangup_early"]
    return {"requests": len(outcomes),
            "by_status": dict(Counter(str(o.status) for o in outcomes)),
            "by_kind": dict(Counter(o.kind for o in outcomes)),
            "cut_streams": sum(o.cut for o in outcomes),  # each is also among the problems
            "max_seconds": round(max(answered, default=0.0), 2),
            "problems": [f"{o.kind}: {o.problem}" for o in outcomes if o.problem]}
