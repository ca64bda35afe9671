"""`hybrid-pd decode`: the decode worker, a KV consumer that pulls from prefillers and serves clients."""

from __future__ import annotations

from hybrid_pd.prefill.launch.worker import worker_main


def main(argv: list[str] | None = None) -> int:
    return worker_main("decode", argv)
