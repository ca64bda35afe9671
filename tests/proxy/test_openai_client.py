"""The official `openai` client against the proxy (fake workers behind it): chat and completions, stream and
not, usage in the stream when asked, and errors as the client's typed exceptions."""

from __future__ import annotations

import openai
import pytest

from tests.proxy.fakes import cluster, run


async def with_client(fn, **options):
    async with cluster(**options) as c:
        client = openai.AsyncOpenAI(base_url=c.url + "/v1", api_key="sk-test", max_retries=0, timeout=10)
        try:
            return await fn(client, c)
        finally:
            await client.close()


def test_completions_and_chat_not_streamed():
    async def fn(client, c):
        c.p.cached_tokens = 2
        out = await client.completions.create(model="fake-model", prompt="hello", max_tokens=4)
        assert out.choices[0].text == "Hello"
        assert out.usage.prompt_tokens_details.cached_tokens == 2
        chat = await client.chat.completions.create(model="fake-model", max_tokens=4,
                                                    messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content == "Hello"
        assert len(c.p.generate_calls) == 2 and len(c.d.generate_calls) == 2
        models = await client.models.list()
        assert [m.id for m in models.data] == ["fake-model"]
    run(with_client(fn))


def test_completions_and_chat_streamed_with_usage():
    async def fn(client, c):
        c.p.cached_tokens = 1
        stream = await client.completions.create(model="fake-model", prompt="hello", max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True})
        chunks = [ch async for ch in stream]
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == "Hello"
        assert chunks[-1].usage.prompt_tokens == 5 and chunks[-1].usage.prompt_tokens_details.cached_tokens == 1
        stream = await client.chat.completions.create(model="fake-model", stream=True,
                                                      messages=[{"role": "user", "content": "hi"}])
        chunks = [ch async for ch in stream]
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "Hello"
        assert all(ch.usage is None for ch in chunks)
    run(with_client(fn))


def test_errors_reach_the_client_typed():
    async def fn(client, c):
        with pytest.raises(openai.BadRequestError) as e:
            await client.completions.create(model="fake-model", prompt="x", max_tokens="many")  # type: ignore
        assert e.value.status_code == 400 and "max_tokens" in e.value.message
        c.d.hang = True
        with pytest.raises(openai.RateLimitError):
            import asyncio
            first = asyncio.create_task(client.completions.create(model="fake-model", prompt="x"))
            await asyncio.wait_for(c.d.received.wait(), 5)
            try:
                await client.completions.create(model="fake-model", prompt="y")
            finally:
                c.d.release.set()
                await first
    run(with_client(fn, max_in_flight=1, max_queue=0))
