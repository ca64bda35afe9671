"""The proxy's own tokenizer (proxy/tokenizer.py) in front of fake workers: with the model's tokenizer loaded no
/tokenize reaches a worker, completions go on as the ids it computed, chat stays chat; request shapes it does not
reproduce, and a tokenizer that cannot load, go through a worker's /tokenize, and the metrics say which.
(Identity with vLLM's own ids, per tiny family and for the openai client's requests: test_tokenizer_engine.py.)"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from hybrid_pd.proxy.openai_api import parse_request
from hybrid_pd.proxy.tokenizer import LocalTokenizer
from tests.proxy.fakes import cluster, metric_value, run, tokens_of

M = "hybrid_pd_proxy_"


@pytest.fixture(scope="module")
def local(tiny_model) -> LocalTokenizer:
    return LocalTokenizer.load(tiny_model)


def tokens(tok: LocalTokenizer, endpoint: str, body: dict) -> list[int] | None:
    return tok.tokens(parse_request(endpoint, json.dumps(body).encode()))


def chat(*messages: dict, **extra) -> dict:
    return {"model": "tiny", "messages": list(messages), **extra}


USER = {"role": "user", "content": "hello world"}


def test_what_is_reproduced_and_what_is_not(local):
    hf = local.tokenizer
    assert tokens(local, "completions", {"prompt": "hello world"}) == hf.encode("hello world")
    assert tokens(local, "completions", {"prompt": "hi", "add_special_tokens": False}) == hf.encode(
        "hi", add_special_tokens=False)
    rendered = "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    assert tokens(local, "chat", chat(USER)) == hf.encode(rendered, add_special_tokens=False)
    one_part = {"role": "user", "content": [{"type": "text", "text": "hello world"}]}
    assert tokens(local, "chat", chat(one_part)) == tokens(local, "chat", chat(USER))
    not_reproduced = [
        ("completions", {"prompt": ["a", "b"]}),
        ("completions", {"prompt": "a", "truncate_prompt_tokens": 3}),
        ("chat", chat(USER, tools=[{"type": "function", "function": {"name": "f"}}])),
        ("chat", chat({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})),
        ("chat", chat({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]})),
        ("chat", chat({"role": "tool", "content": "r", "tool_call_id": "1"})),
        ("chat", chat({"role": "developer", "content": "be brief"}, USER)),
        ("chat", chat({"role": "assistant", "content": "", "tool_calls": []})),
        ("chat", chat({"role": "system", "content": "x-anthropic-billing-header: cch=1\nhi"}, USER)),
        ("chat", chat(USER, chat_template="{{ messages }}")),
        ("chat", chat(USER, chat_template_kwargs={"tokenize": False})),
        ("chat", chat(USER, add_special_tokens=True)),
        ("chat", chat(USER, add_generation_prompt=True, continue_final_message=True)),
    ]
    for endpoint, body in not_reproduced:
        assert tokens(local, endpoint, {"model": "tiny", **body}) is None, body


async def post(url: str, path: str, body: dict) -> dict:
    async with aiohttp.ClientSession() as s, s.post(url + path, json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def loaded(c, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if c.proxy.state.tokenizer is not None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the local tokenizer did not load")


def test_local_tokenizer_replaces_the_round_trip(tiny_model, local):
    """kv_hit routing needs ids: with --tokenizer set, neither completions nor chat ask a worker's /tokenize;
    completions reach P and D as the ids, chat as the same messages."""

    async def body():
        async with cluster(decode_policy="kv_hit", tokenizer=tiny_model, pd_policy="always-remote") as c:
            await loaded(c)
            prompt = "the quick brown fox"
            await post(c.url, "/v1/completions", {"model": "tiny", "prompt": prompt, "max_tokens": 3})
            await post(c.url, "/v1/chat/completions", chat(USER, max_tokens=3))
            seen = [s for w in (*c.prefill, *c.decode) for s in w.seen]
            assert not [s for s in seen if s.path == "/tokenize"]
            completions = [s.body for s in seen if s.path == "/v1/completions"]
            assert [b["prompt"] for b in completions] == [local.tokenizer.encode(prompt)] * 2
            chats = [s.body for s in seen if s.path == "/v1/chat/completions"]
            assert [b["messages"] for b in chats] == [[USER]] * 2 and all("prompt" not in b for b in chats)
            metrics = c.proxy.state.metrics.render().decode()
            assert metric_value(metrics, M + "tokenized_prompts_total", source="local") == 2
            assert metric_value(metrics, M + "tokenizer_local") == 1

    run(body(), timeout=120)


def test_fallback_to_the_workers_tokenize(tmp_path):
    """A tokenizer that does not load (and, with it loaded, a shape it does not reproduce) goes through a worker's
    /tokenize: the fake's one-token-per-character ids reach the workers."""

    async def body():
        async with cluster(decode_policy="kv_hit", tokenizer=str(tmp_path / "missing"), pd_policy="always-remote") as c:
            for _ in range(100):  # the load task has run and failed
                if all(t.done() for t in asyncio.all_tasks() if t.get_name() == "tokenizer"):
                    break
                await asyncio.sleep(0.05)
            await post(c.url, "/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": 3})
            seen = [s for w in (*c.prefill, *c.decode) for s in w.seen]
            assert [s.path for s in seen if s.path == "/tokenize"] == ["/tokenize"]
            assert [s.body["prompt"] for s in seen if s.path == "/v1/completions"] == [tokens_of("abc")] * 2
            metrics = c.proxy.state.metrics.render().decode()
            assert metric_value(metrics, M + "tokenized_prompts_total", source="remote") == 1
            assert metric_value(metrics, M + "tokenizer_local") == 0

    run(body(), timeout=60)


def test_shapes_not_reproduced_ask_the_worker(tiny_model):
    async def body():
        async with cluster(decode_policy="kv_hit", tokenizer=tiny_model, pd_policy="always-remote") as c:
            await loaded(c)
            two_parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
            await post(c.url, "/v1/chat/completions", chat(two_parts, max_tokens=3))
            await post(c.url, "/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": 3})
            seen = [s for w in (*c.prefill, *c.decode) for s in w.seen]
            assert [s.body.get("messages") for s in seen if s.path == "/tokenize"] == [[two_parts]]
            metrics = c.proxy.state.metrics.render().decode()
            assert metric_value(metrics, M + "tokenized_prompts_total", source="remote") == 1
            assert metric_value(metrics, M + "tokenized_prompts_total", source="local") == 1

    run(body(), timeout=120)


def test_not_ready_while_the_tokenizer_loads(tiny_model, monkeypatch):
    """/health (readiness) is 503 "loading the tokenizer" while the load runs, so that no traffic pays a
    worker's /tokenize per prompt meanwhile; 200 once it has loaded, and the first request is tokenized locally.
    The load is held on an event (the real load then runs), so the test sees the window whatever the CPU."""
    import threading

    release = threading.Event()
    real_load = LocalTokenizer.load.__func__

    def held_load(cls, source, local_only=False):
        assert release.wait(60), "the test never released the load"
        return real_load(cls, source, local_only)

    monkeypatch.setattr(LocalTokenizer, "load", classmethod(held_load))

    async def health(url: str) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as s, s.get(url + "/health") as r:
            return r.status, await r.json()

    async def body():
        async with cluster(decode_policy="kv_hit", tokenizer=tiny_model, pd_policy="always-remote") as c:
            await asyncio.sleep(0.3)  # the workers are admitted, the load is running
            status, answer = await health(c.url)
            assert (status, answer["status"]) == (503, "loading the tokenizer"), answer
            release.set()
            await loaded(c)
            status, answer = await health(c.url)
            assert (status, answer["status"]) == (200, "ok"), answer
            await post(c.url, "/v1/completions", {"model": "tiny", "prompt": "abc", "max_tokens": 3})
            seen = [s for w in (*c.prefill, *c.decode) for s in w.seen]
            assert not [s for s in seen if s.path == "/tokenize"]

    run(body(), timeout=120)


def hub_cache(tiny_model: str, home) -> str:
    """The tiny model's tokenizer files as the Hugging Face Hub cache under HF_HOME `home` keeps a downloaded
    repository (hub/models--ORG--NAME/snapshots/REV, refs/main = REV), as the workers' download leaves it on
    their model volume; its id."""
    import shutil
    from pathlib import Path

    repo = Path(home) / "hub" / "models--acme--tiny-hybrid"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True)
    for f in Path(tiny_model).iterdir():
        if f.is_file() and f.suffix in (".json", ".jinja", ".txt", ".model"):
            shutil.copy(f, snapshot / f.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")
    return "acme/tiny-hybrid"


def test_an_id_is_read_from_the_machines_hub_cache_never_downloaded(tiny_model, tmp_path):
    """--tokenizer auto with decoders that name a Hub id: the proxy reads it from the Hugging Face cache the
    workers filled (the Kubernetes proxy mounts their model volume, HF_HOME on it), offline; an id not there
    fails at once (no download), and the proxy keeps asking the workers' /tokenize. A fresh interpreter: the
    Hub's cache location is read when it is imported."""
    import subprocess
    import sys

    model_id = hub_cache(tiny_model, tmp_path / "hf")
    code = ("import sys; from hybrid_pd.proxy.tokenizer import LocalTokenizer as T\n"
            "try:\n    t = T.load(sys.argv[1], True)\nexcept Exception as e:\n    print('failed', type(e).__name__)\n"
            "else:\n    print('ids', t.tokenizer.encode('hello world'))")
    env = {**__import__("os").environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    got = subprocess.run([sys.executable, "-c", code, model_id], env=env, capture_output=True, text=True, timeout=120)
    want = LocalTokenizer.load(tiny_model).tokenizer.encode("hello world")
    assert got.stdout.strip() == f"ids {want}", got.stderr[-2000:]
    # not even online is an id missing from the cache asked of the Hub: a listener stands in for it and records
    # the request lines it gets (huggingface_hub may ask it other things of its own, not the model's files)
    import socket
    import threading

    asked: list[bytes] = []
    with socket.socket() as hub:
        hub.bind(("127.0.0.1", 0))
        hub.listen(8)

        def listen():
            while True:
                try:
                    conn, _ = hub.accept()
                except OSError:  # closed
                    return
                with conn:
                    asked.append(conn.recv(4096).split(b"\r\n")[0])

        threading.Thread(target=listen, daemon=True).start()
        env.pop("HF_HUB_OFFLINE")
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{hub.getsockname()[1]}"
        missing = subprocess.run([sys.executable, "-c", code, "acme/not-downloaded"], env=env, capture_output=True,
                                 text=True, timeout=120)
    assert missing.stdout.strip().startswith("failed"), missing.stdout + missing.stderr[-2000:]
    assert not [line for line in asked if b"not-downloaded" in line], asked


@pytest.mark.parametrize("root_is_a_folder", [True, False])
def test_auto_loads_what_the_decoders_name_a_folder_as_is_an_id_from_the_cache_only(tiny_model, monkeypatch,
                                                                                    root_is_a_folder):
    calls = []

    def recorded(cls, source, local_only=False):
        calls.append((source, local_only))
        raise OSError("not loaded in this test")

    monkeypatch.setattr(LocalTokenizer, "load", classmethod(recorded))
    root = tiny_model if root_is_a_folder else "acme/tiny-hybrid"

    async def body():
        async with cluster(decode_policy="kv_hit", tokenizer="auto", pd_policy="always-remote", model_root=root):
            for _ in range(200):
                if calls:
                    break
                await asyncio.sleep(0.05)
            assert calls == [(root, not root_is_a_folder)]

    run(body(), timeout=60)


def test_the_last_message_starts_where_the_earlier_messages_end(local):
    """An agent loop's turn: the conversation, then a fixed instruction as the last message. The junction is
    the earlier messages rendered alone (closed, no generation prompt), a prefix of the whole prompt's ids; the
    next turn, which keeps the conversation and drops the instruction, shares exactly those tokens."""
    history = [{"role": "system", "content": "You are a careful agent."}, {"role": "user", "content": "List files."},
               {"role": "assistant", "content": "ls"}, {"role": "user", "content": "a.txt b.txt"}]
    instruction = {"role": "user", "content": "Answer with one command."}
    body = chat(*history, instruction)
    request = parse_request("chat", json.dumps(body).encode())
    ids = local.tokens(request)
    at = local.last_message_start(request, ids)
    assert at is not None and 0 < at < len(ids)
    following = chat(*history, {"role": "assistant", "content": "cat a.txt"}, {"role": "user", "content": "hi"},
                     instruction)
    nxt = tokens(local, "chat", following)
    diverges = next(i for i, (a, b) in enumerate(zip(nxt, ids)) if a != b)
    assert at <= diverges <= at + 4  # in the next message's header: its role
    alone = parse_request("chat", json.dumps(chat(instruction)).encode())
    assert local.last_message_start(alone, local.tokens(alone)) is None  # one message: no junction
    completion = parse_request("completions", json.dumps({"model": "m", "prompt": "a b c"}).encode())
    assert local.last_message_start(completion, [1, 2, 3]) is None
    assert local.last_message_start(request, [7] + ids[1:]) is None  # not a prefix of these ids
