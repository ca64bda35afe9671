"""`serve_in_background`'s lifecycle: what it starts, it stops, also when the server cannot start."""

from __future__ import annotations

import asyncio
import socket

import pytest

from hybrid_pd.proxy.app import serve_in_background
from hybrid_pd.proxy.config import ProxyConfig

from .fakes import run


def test_a_taken_port_fails_the_start_and_stops_what_was_started():
    async def main() -> None:
        before = asyncio.all_tasks()
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            # health checks on: the background starts its loop before the server tries the port
            config = ProxyConfig.from_flat({"port": port, "decode": ["http://127.0.0.1:9"], "health_interval": 30})
            with pytest.raises(SystemExit):  # uvicorn's answer to a port it cannot bind
                async with serve_in_background(config):
                    pytest.fail("served on a taken port")
        await asyncio.sleep(0)  # the cancelled loops finish
        assert asyncio.all_tasks() == before

    run(main())


def test_leaving_stops_the_background_and_the_server():
    async def main() -> None:
        before = asyncio.all_tasks()
        config = ProxyConfig.from_flat({"port": 0, "decode": ["http://127.0.0.1:9"], "health_interval": 30})
        async with serve_in_background(config) as proxy:
            assert any(t.get_name() == "health" for t in asyncio.all_tasks())
            host, port = proxy.url.removeprefix("http://").split(":")
        await asyncio.sleep(0)
        assert asyncio.all_tasks() == before
        with pytest.raises(OSError):
            await asyncio.open_connection(host, int(port))

    run(main())
