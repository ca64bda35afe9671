"""Real engines for the engine lane, shared by its modules, and the PD calls and decoder metrics its tests share.

An engine takes 20-60 s to start and holds 2-3 GB; most modules want the same few (one plain engine of the tiny
model, a prefiller and a decoder with our connector). So every engine comes from one pool per session, keyed by its
configuration (`Spec`): a module that asks for a configuration the pool already runs gets that engine, with its
prefix cache emptied first (vLLM's development endpoint /reset_prefix_cache), so that it holds what a fresh engine
would. Metrics are counters, and the tests read them as deltas. A module whose test kills or stops an engine takes
it out of the pool first (`Engines.take`), so no later module is handed what it left.

At most CAPACITY engines run at once (24 GB on the 2-core test bed, shared with other work): a start that would pass
it stops the idle engine used least recently. Idle engines cost no CPU (tests/e2e/test_upstream_pd.py checks that),
and the tests send one request at a time, so engines left idle on a core do not slow the ones in use.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.conversation import complete
from tests.support.procs import Launched, free_port, http_json, metric_sum, scrape_metrics, worker_argv

CAPACITY = 5
# seconds an engine may take to get healthy: on a fresh GPU machine the first GDN engine compiled Triton kernels for
# more than 300 s beside a benchmark's engines (2026-11-27-h100x2-qwen3next-pd-tax-vllm033); bench_gpu.sh families
# raises it there
START_S = float(os.environ.get("HYBRID_PD_TEST_START_S", "300"))
# the prefix cache cannot be emptied while blocks are held: a prefiller's blocks wait for their decoder or their
# lease (10 s in these tests); past this, the engine is started again instead
EMPTY_CACHE_S = 30.0


@dataclass(frozen=True)
class Spec:
    """One engine's configuration; engines of equal specs are interchangeable (only their ports differ)."""

    role: str  # prefill | decode
    connector: str  # hybrid | upstream | none
    cores: str  # --cpu-bind
    model: str  # the model folder
    env: tuple[tuple[str, str], ...] = ()  # sorted
    vllm_args: tuple[str, ...] = ()  # after "--"

    @classmethod
    def of(cls, role: str, connector: str, cores: str, model: str, env: dict | None = None,
           vllm_args: tuple[str, ...] = ()) -> Spec:
        return cls(role, connector, cores, model, tuple(sorted((env or {}).items())), tuple(vllm_args))


@dataclass
class _Held:
    proc: Launched
    owner: str  # the module that asked for it last
    used: int  # when it was asked for last (a tick of the pool's clock)


@dataclass
class EnginePool:
    """The session's engines, one per `Spec`, at most `capacity` running."""

    logs_dir: Path
    capacity: int = CAPACITY
    held: dict[Spec, _Held] = field(default_factory=dict)
    starts: list[tuple[str, str, float]] = field(default_factory=list)  # (module, engine name, seconds to healthy)
    _clock: itertools.count = field(default_factory=itertools.count)

    def up(self, owner: str, wanted: dict[str, Spec]) -> dict[str, Launched]:
        """The engines `wanted` (name -> spec) running and healthy, for module `owner`."""
        for spec in [s for s, h in self.held.items() if h.proc.proc.poll() is not None]:
            self.held.pop(spec).proc.stop()  # died, or stopped by a test: never handed out again
        names: dict[Spec, str] = {}
        for name, spec in wanted.items():
            names.setdefault(spec, name)
        for spec in [s for s in names if s in self.held and self.held[s].owner != owner]:
            if not self._empty_cache(self.held[spec].proc):  # blocks still held: a fresh engine instead
                self.held.pop(spec).proc.stop()
        missing = [s for s in names if s not in self.held]
        while len(self.held) + len(missing) > self.capacity:
            idle = [s for s in self.held if s not in names]
            assert idle, f"{owner} wants {len(names)} engines at once, the pool runs at most {self.capacity}"
            self.held.pop(min(idle, key=lambda s: self.held[s].used)).proc.stop()
        t0 = time.monotonic()
        for spec in missing:  # side by side; held at once, so that stop_all stops one that never got healthy
            self.held[spec] = _Held(self._start(owner, names[spec], spec), owner, 0)
        for spec in missing:
            self.held[spec].proc.wait_healthy(START_S)
            self.starts.append((owner, names[spec], time.monotonic() - t0))
        for spec in names:
            self.held[spec].owner, self.held[spec].used = owner, next(self._clock)
        return {name: self.held[spec].proc for name, spec in wanted.items()}

    def stop(self, spec: Spec) -> None:
        if spec in self.held:
            self.held.pop(spec).proc.stop()

    def take(self, spec: Spec) -> Launched:
        """Hand an engine over for good (to a test that kills or stops it): the pool forgets it."""
        return self.held.pop(spec).proc

    def stop_all(self) -> None:
        while self.held:
            self.held.popitem()[1].proc.stop()

    def _start(self, owner: str, name: str, spec: Spec) -> Launched:
        port = free_port()
        argv = worker_argv(spec.role, connector=spec.connector, port=port, cpu_bind=spec.cores, model=spec.model,
                           extra=["--", *spec.vllm_args] if spec.vllm_args else [])
        env = {**dict(spec.env), "VLLM_SERVER_DEV_MODE": "1"}  # serves /reset_prefix_cache, for the next module
        module = owner.rpartition("/")[2].removesuffix(".py")
        log_name = f"{module}-{name}-{next(self._clock)}"  # a clock tick: unique
        return Launched(log_name, argv, f"http://127.0.0.1:{port}", self.logs_dir, env)

    @staticmethod
    def _empty_cache(proc: Launched) -> bool:
        deadline = time.monotonic() + EMPTY_CACHE_S
        while True:
            if http_json(proc.url + "/reset_prefix_cache", {}).get("success"):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)


class Engines:
    """A module's named engines, from the session's pool; `up(names)` returns their URLs, started if need be."""

    def __init__(self, pool: EnginePool, owner: str, specs: dict[str, Spec | tuple],
                 vllm_args: tuple[str, ...] = ()):
        """`specs`: name -> Spec, or (role, connector, cores, model, environment); `vllm_args`: flags every
        engine passes to vLLM."""
        self.pool, self.owner, self.running, self.logs = pool, owner, {}, {}
        self.specs = {name: s if isinstance(s, Spec) else Spec.of(*s, vllm_args=vllm_args)
                      for name, s in specs.items()}

    def up(self, *names: str, ahead: tuple[str, ...] = ()) -> dict[str, str]:
        """`ahead`: engines a later test asks for, started now beside the missing ones (two starts side by side
        take about as long as one on the 2-core test bed)."""
        procs = self.pool.up(self.owner, {n: self.specs[n] for n in (*names, *ahead)})
        self.running.update(procs)
        self.logs.update({n: p.log_path for n, p in procs.items()})
        return {n: procs[n].url for n in names}

    def __getitem__(self, name: str) -> Launched:
        return self.running[name]

    def stop(self, name: str) -> None:
        """Stop `name` now: no later test asks for it (room for the next engines)."""
        self.running.pop(name, None)
        self.pool.stop(self.specs[name])

    def take(self, name: str) -> Launched:
        """The running engine `name`, no longer the pool's: the caller kills or stops it."""
        self.running.pop(name)
        return self.pool.take(self.specs[name])


def pd_complete(p_url: str, d_url: str, prompt: str | list[int], max_tokens: int = 12,
                p_params: dict | None = None, **extra) -> tuple[dict, dict]:
    """P then D as the proxy's flow calls them; `p_params`: more of P's kv_transfer_params (its stop)."""
    p_resp = complete(p_url, prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True, **(p_params or {})})
    params = p_resp.get("kv_transfer_params")
    assert params and params["remote_block_ids"], p_resp
    return p_resp, complete(d_url, prompt, max_tokens, kv_transfer_params=params, **extra)


def d_metrics(url: str) -> dict[str, float]:
    m = scrape_metrics(url)
    return {k: metric_sum(m, f"vllm:{k}") for k in (
        "hybrid_pd_bytes_transferred_sum", "hybrid_pd_bytes_transferred_count", "hybrid_pd_descriptors_sum",
        "hybrid_pd_checkpoints_shipped_total", "hybrid_pd_failed_transfers_total", "prefix_cache_hits_total",
        "kv_cache_usage_perc")}


def delta(before: dict, after: dict) -> dict:
    return {k: after[k] - before[k] for k in before}
