"""Per-request transfer metrics through vLLM's KV-connector stats and Prometheus (vLLM glue).

Each finished load adds one observation: bytes, descriptors, seconds, failed, checkpoints shipped, and whether
it failed because landed blocks differed from the prefiller's digests (connector/integrity.py). They
surface on D's /metrics as `vllm:hybrid_pd_*` and in vLLM's periodic log line (`reduce`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.v1.metrics.utils import create_metric_per_engine

KEYS = ("bytes", "descriptors", "seconds", "failed", "checkpoints", "digest_mismatch")


@dataclasses.dataclass
class HybridPDStats(KVConnectorStats):
    def __post_init__(self):
        for key in KEYS:
            self.data.setdefault(key, [])

    def record(
        self, bytes: int, descriptors: int, seconds: float, failed: bool, checkpoints: int, digest_mismatch: bool
    ) -> None:
        for key, value in zip(KEYS, (bytes, descriptors, seconds, int(failed), checkpoints, int(digest_mismatch))):
            self.data[key].append(value)

    def reset(self):
        self.data = {key: [] for key in KEYS}

    def aggregate(self, other: KVConnectorStats) -> HybridPDStats:
        for key in KEYS:
            self.data[key] = self.data.get(key, []) + list(other.data.get(key, []))
        return self

    def reduce(self) -> dict[str, int | float]:
        n = len(self.data["bytes"])
        return {
            "transfers": n,
            "bytes": sum(self.data["bytes"]),
            "descriptors": sum(self.data["descriptors"]),
            "failed": sum(self.data["failed"]),
            "checkpoints": sum(self.data["checkpoints"]),
            "digest_mismatch": sum(self.data["digest_mismatch"]),
            "avg_seconds": round(sum(self.data["seconds"]) / n, 4) if n else 0.0,
        }

    def is_empty(self) -> bool:
        return not self.data["bytes"]


class HybridPDPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)

        def hist(name: str, doc: str, buckets: list[float]):
            # vLLM types metric_types' values as the union of the three classes: this one is a Histogram
            metric = self._histogram_cls(
                name=name,
                documentation=doc,
                buckets=buckets,  # type: ignore[call-arg]
                labelnames=labelnames,
            )
            return create_metric_per_engine(metric, per_engine_labelvalues)

        def counter(name: str, doc: str):
            return create_metric_per_engine(
                self._counter_cls(name=name, documentation=doc, labelnames=labelnames), per_engine_labelvalues
            )

        self.hists = {
            "bytes": hist(
                "vllm:hybrid_pd_bytes_transferred",
                "Bytes READ per request by hybrid-pd.",
                [2.0 ** (10 + i) for i in range(0, 25, 2)],
            ),
            "descriptors": hist(
                "vllm:hybrid_pd_descriptors",
                "NIXL descriptors per request (coalesced).",
                [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024],
            ),
            "seconds": hist(
                "vllm:hybrid_pd_xfer_time_seconds",
                "Handshake + READ time per request.",
                [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0],
            ),
        }
        self.counters = {
            "failed": counter("vllm:hybrid_pd_failed_transfers", "Loads that failed (request recomputed)."),
            "checkpoints": counter("vllm:hybrid_pd_checkpoints_shipped", "Aligned Mamba checkpoints read."),
            "digest_mismatch": counter(
                "vllm:hybrid_pd_digest_mismatches",
                "Loads whose landed blocks differed from the prefiller's digests (failed, request recomputed).",
            ),
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        for key, metric in self.hists.items():
            for value in transfer_stats_data.get(key, []):
                metric[engine_idx].observe(value)
        for key, metric in self.counters.items():
            total = sum(transfer_stats_data.get(key, []))
            if total:
                metric[engine_idx].inc(total)
