"""`hybrid-pd prefill`: the prefill worker, a KV producer that prefills for decoders (launch/worker.py)."""

from __future__ import annotations

from hybrid_pd.prefill.launch.worker import worker_main


def main(argv: list[str] | None = None) -> int:
    return worker_main("prefill", argv)
