"""Everything one proxy instance shares between requests, built once from its config."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .admission import Admission
from .config import ProxyConfig
from .kv.index import KVIndex
from .kv.prompt_keys import ChainCache
from .metrics import ProxyMetrics
from .placement.cost_model import PRIORS
from .placement.online_rates import OnlineRates
from .routing import Deps, Router
from .tokenizer import LocalTokenizer
from .upstream import Upstream
from .workers import WorkerPool


@dataclass
class ProxyState:
    config: ProxyConfig
    pool: WorkerPool
    kv_index: KVIndex
    hash_cache: ChainCache  # prompts' block hashes, remembered across requests
    metrics: ProxyMetrics
    upstream: Upstream
    admission: Admission
    deps: Deps
    decode_router: Router
    prefill_router: Router
    rates: OnlineRates  # the cost model's (placement/cost_model.py), learned from this proxy's requests
    tokenizer: LocalTokenizer | None = None  # the model's own tokenizer, once loaded (background.py)
    # While the tokenizer loads, until this time.monotonic() at most, /health answers 503 (background.py)
    tokenizer_loading_until: float = 0.0
    # --warm-pairs (pair_warmup.py): the (P, D) pairs warmed since both were admitted, and until when at most
    # /health answers 503 while the first ones warm
    pairs_warmed: set[tuple[str, str | None, str, str | None]] = field(default_factory=set)
    pairs_warming_until: float = 0.0

    @classmethod
    def build(cls, config: ProxyConfig) -> ProxyState:
        metrics = ProxyMetrics()
        kv_index = KVIndex(config.kv.hash_algo, config.kv.hash_seed, config.kv.grace_s)
        deps = Deps(kv_index, config.kv)
        pool = WorkerPool()
        pool.set_workers("prefill", config.prefill)
        pool.set_workers("decode", config.decode)
        metrics.worker_prompt_tokens.set_children_function(
            lambda: {(w.role, w.url): w.queued_tokens for w in pool.all()}
        )
        rates = OnlineRates(replace(PRIORS, align_split=config.disagg.align_split))
        metrics.placement_rates.set_children_function(lambda: {(k,): v for k, v in rates.as_dict().items()})
        metrics.placement_observations.set_children_function(
            lambda: {(k,): float(v) for k, v in rates.observations.items()}
        )
        return cls(
            config=config,
            pool=pool,
            kv_index=kv_index,
            hash_cache=ChainCache(),
            metrics=metrics,
            upstream=Upstream(config.timeouts),
            admission=Admission(config.admission, metrics),
            deps=deps,
            decode_router=Router("decode", config.routing.decode, deps),
            prefill_router=Router("prefill", config.routing.prefill, deps),
            rates=rates,
        )
