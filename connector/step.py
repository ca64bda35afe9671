"""What the scheduler side hands the worker side each step (vLLM carries it as the connector's metadata)."""

from __future__ import annotations

import dataclasses

from hybrid_pd.connector.messages import RemotePrefill
from hybrid_pd.connector.plan import TransferPlan


@dataclasses.dataclass(frozen=True)
class LoadJob:
    request_id: str
    remote: RemotePrefill
    plan: TransferPlan | None  # None: read nothing, only tell P to free (D rejected the request)
    reason: str = ""
    fail: bool = False  # report the request as a failed load (vLLM recomputes it)


@dataclasses.dataclass
class StepMeta:
    """Scheduler -> worker, once per step."""

    loads: list[LoadJob] = dataclasses.field(default_factory=list)
    leases: dict[str, float] = dataclasses.field(default_factory=dict)  # P: request id -> lease seconds
    # P: request id -> per-group block ids to digest after this step's forward pass (its prompt completes in it)
    digests: dict[str, list[list[int]]] = dataclasses.field(default_factory=dict)
    failed_waits: list[str] = dataclasses.field(default_factory=list)  # D: early decodes P never fed (metrics)
    idle: bool = False  # the step computes nothing: the worker may wait for its READs instead of spinning
