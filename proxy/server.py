"""`hybrid-pd proxy`: run the proxy until SIGTERM or SIGINT, then drain and exit 0.

    hybrid-pd proxy --port 8000 --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200 \
        [--prefill-events tcp://127.0.0.1:5700 --decode-events tcp://127.0.0.1:5701] \
        [--decode-policy kv_hit=2,least_loaded --prefill-policy kv_hit,least_loaded] [--config proxy.json]

`hybrid-pd proxy --help` lists every flag; a broken combination is refused at start with the flag to change.

The first SIGTERM or SIGINT drains (app.RunningProxy.drain: --drain-delay-s, --drain-timeout-s); a second one
stops at once (open requests get a 503, open streams an SSE error event).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from .app import serve_in_background
from .config import ProxyConfig
from .config.sources import load_config
from .errors import ConfigError
from .memory import return_large_buffers_to_the_os

log = logging.getLogger("hybrid_pd.proxy")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = load_config(argv)
    except ConfigError as e:
        print(f"hybrid-pd proxy: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # argparse: --help or a malformed flag
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return_large_buffers_to_the_os()
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve_until_signal(config))
    return 0


async def serve_until_signal(config: ProxyConfig) -> None:
    signals = asyncio.Queue[int]()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, signals.put_nowait, sig)
    try:
        async with serve_in_background(config) as proxy:
            log.info(
                "hybrid-pd proxy listening on %s (decode: %d, prefill: %d workers)",
                proxy.url,
                len(config.decode),
                len(config.prefill),
            )
            print(f"hybrid-pd proxy listening on {proxy.url}", flush=True)
            log.info("%s: draining", signal.Signals(await signals.get()).name)
            drain = asyncio.create_task(proxy.drain())
            again = asyncio.create_task(signals.get())
            await asyncio.wait((drain, again), return_when=asyncio.FIRST_COMPLETED)
            if again.done():
                log.warning("%s again: stopping now", signal.Signals(again.result()).name)
            for task in (drain, again):
                task.cancel()
            log.info("stopping")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


if __name__ == "__main__":
    sys.exit(main())
