"""`WorkerReport`: what each TP rank's worker tells the scheduler with a step's output (vLLM's worker metadata,
aggregated over ranks by vLLM): failed loads and P's KV integrity digests."""

from __future__ import annotations

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata

from hybrid_pd.connector.integrity import RequestDigests
from hybrid_pd.connector.messages import GroupDigests


class WorkerReport(KVConnectorWorkerMetadata):
    """`failed`: vLLM < 0.32, loads that failed although `get_finished` reports them finished (those releases
    have no per-request failure channel, and their block-level one, invalid_block_ids, assumes a single
    KV-cache group: a hybrid model's engine would die on it). `digests`: P, request id -> TP rank -> the
    integrity digests of its blocks, computed after the step in which its prompt completed. `pending`: this
    rank's digests of the step, queued behind its forward pass (integrity.RequestDigests); read back when the
    scheduler first looks at `digests`, with the step's output, which vLLM takes after its own wait for the
    step, or when vLLM pickles the report for another process: never inside the step."""

    def __init__(
        self,
        failed: set[str],
        digests: dict[str, dict[int, list[GroupDigests]]],
        pending: tuple[int, RequestDigests] | None = None,
    ):
        self.failed, self._digests, self._pending = set(failed), digests, pending

    @property
    def digests(self) -> dict[str, dict[int, list[GroupDigests]]]:
        if self._pending is not None:
            (rank, pending), self._pending = self._pending, None
            for req_id, groups in pending.result().items():
                self._digests.setdefault(req_id, {})[rank] = groups
        return self._digests

    def __getstate__(self) -> dict:
        return {"failed": self.failed, "_digests": self.digests, "_pending": None}

    def aggregate(self, other: KVConnectorWorkerMetadata) -> WorkerReport:
        self.failed |= getattr(other, "failed", set())
        for req_id, ranks in getattr(other, "digests", {}).items():
            self.digests.setdefault(req_id, {}).update(ranks)
        return self
