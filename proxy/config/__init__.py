"""The proxy's one frozen configuration object, validated when built.

`ProxyConfig.from_flat(options)` takes the flat option names that the CLI flags, the environment
(`HYBRID_PD_PROXY_<NAME>`) and the JSON `--config` file share (see config_sources.py) and refuses a broken
combination with a `ConfigError` that names the flag to change.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlparse

from ..errors import ConfigError
from ..kv.block_hash import DEFAULT_NONE_HASH_SEED
from .sections import (
    AdmissionConfig,
    DisaggConfig,
    DrainConfig,
    HashAlgo,
    HealthConfig,
    K8sConfig,
    KVIndexConfig,
    Policy,
    RoutingConfig,
    Timeouts,
    WorkerSpec,
    same_engine,
)

# The sections are importable from here too (config_sections.py holds them so that components import no cycle).
__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "AdmissionConfig",
    "DisaggConfig",
    "DrainConfig",
    "HashAlgo",
    "HealthConfig",
    "K8sConfig",
    "KVIndexConfig",
    "Policy",
    "ProxyConfig",
    "RoutingConfig",
    "Timeouts",
    "WorkerSpec",
    "parse_policy",
    "same_engine",
]


@dataclass(frozen=True)
class ProxyConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    prefill: tuple[WorkerSpec, ...] = ()
    decode: tuple[WorkerSpec, ...] = ()
    discovery: Literal["static", "k8s"] = "static"
    k8s: K8sConfig = field(default_factory=K8sConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    kv: KVIndexConfig = field(default_factory=KVIndexConfig)
    disagg: DisaggConfig = field(default_factory=DisaggConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    @property
    def tokenize(self) -> bool:
        """Prompts are tokenized (POST /tokenize on a worker) only when a policy or threshold needs the ids."""
        by_hit = self.routing.uses("kv_hit") or self.routing.uses("queue_cost")
        return by_hit or (self.disagg.enabled and self.disagg.min_prompt_tokens > 0)

    def problems(self) -> list[str]:
        from ..routing import PICKERS, SCORERS  # the registered plugins (late: they load with the routing package)

        out: list[str] = []
        if not 0 <= self.port <= 65535:
            out.append(f"--port {self.port} is not a TCP port")
        if self.discovery == "static" and not self.decode:
            out.append("no decode worker: pass --decode URL (repeatable) or --discovery k8s")
        if self.discovery == "k8s" and not self.k8s.api_url and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            out.append("--discovery k8s outside a pod (no KUBERNETES_SERVICE_HOST): pass --k8s-api-url")
        if self.discovery not in ("static", "k8s"):
            out.append(f"--discovery {self.discovery!r}: choose static or k8s")
        for flag, specs in (("--prefill", self.prefill), ("--decode", self.decode)):
            for spec in specs:
                u = urlparse(spec.url)
                if u.scheme not in ("http", "https") or not u.hostname:
                    out.append(f"{flag} {spec.url!r} is not an http(s)://host:port URL")
                ev = (spec.events or "").removeprefix("bind:").removeprefix("connect:")
                if spec.events is not None and not ev.startswith(("tcp://", "ipc://", "inproc://")):
                    out.append(f"{flag}-events {spec.events!r} is not a ZMQ endpoint ([bind:|connect:]tcp://host:port)")
        for flag, pol in (("--decode-policy", self.routing.decode), ("--prefill-policy", self.routing.prefill)):
            for name, weight in pol.scorers:
                if name not in SCORERS:
                    out.append(f"{flag}: unknown scorer {name!r}; known: {', '.join(sorted(SCORERS))}")
                if not weight > 0:
                    out.append(f"{flag}: weight of {name!r} must be > 0, got {weight}")
            if pol.picker not in PICKERS:
                out.append(
                    f"{flag.replace('policy', 'picker')}: unknown picker {pol.picker!r}; "
                    f"known: {', '.join(sorted(PICKERS))}"
                )
        if self.kv.hash_algo not in ("sha256", "sha256_cbor"):
            out.append(
                f"--kv-hash-algo {self.kv.hash_algo!r}: only sha256 and sha256_cbor are reproducible "
                "across processes (xxhash uses a random per-process seed)"
            )
        if self.kv.hash_block_size < 0:
            out.append("--kv-hash-block-size must be >= 0 (0 learns it from the KV events)")
        if not 0.0 < self.disagg.decoder_hit_ratio <= 1.0:
            out.append(f"--decoder-hit-ratio {self.disagg.decoder_hit_ratio} must be in (0, 1]")
        if self.disagg.remote_overhead_tokens < 0:
            out.append(f"--remote-overhead-tokens {self.disagg.remote_overhead_tokens} must be >= 0")
        if self.disagg.min_uncached_blocks < 0:
            out.append(f"--min-uncached-blocks {self.disagg.min_uncached_blocks} must be >= 0")
        if self.disagg.min_prompt_tokens < 0 or self.disagg.min_prompt_chars < 0:
            out.append("--min-prompt-tokens / --min-prompt-chars must be >= 0")
        for name in ("connect_s", "prefill_s", "decode_first_byte_s", "total_s", "tokenize_s", "health_s"):
            if not getattr(self.timeouts, name) > 0:
                out.append(f"--{name.removesuffix('_s').replace('_', '-')}-timeout must be > 0 seconds")
        if self.admission.max_in_flight < 1 or self.admission.max_queue < 0:
            out.append("--max-in-flight must be >= 1 and --max-queue >= 0")
        if not self.admission.queue_timeout_s > 0:
            out.append("--queue-timeout must be > 0 seconds")
        if self.health.interval_s < 0 or self.health.failures_to_eject < 1 or self.health.successes_to_readmit < 1:
            out.append("--health-interval must be >= 0, --health-failures and --health-successes >= 1")
        if self.health.load_interval_s < 0:
            out.append("--load-interval must be >= 0 seconds (0: count only this proxy's requests)")
        if self.drain.delay_s < 0 or self.drain.timeout_s < 0:
            out.append("--drain-delay-s and --drain-timeout-s must be >= 0 seconds")
        if self.kv.grace_s < 0:
            out.append("--kv-index-grace-s must be >= 0 seconds (0: a removed worker's index goes at once)")
        if not self.k8s.poll_interval_s > 0 or not self.k8s.watch_timeout_s > 0:
            out.append("--k8s-poll-interval-s and --k8s-watch-timeout-s must be > 0 seconds")
        if self.log_level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            out.append(f"--log-level {self.log_level!r}: choose DEBUG, INFO, WARNING, ERROR or CRITICAL")
        if not self.routing.session_header or not self.routing.session_header.isascii():
            out.append("--session-header must be a non-empty ASCII header name")
        return out

    @classmethod
    def from_flat(cls, o: dict[str, Any]) -> ProxyConfig:
        """Build from flat option names (the CLI flag names with `_`): see config_sources.OPTIONS."""

        def workers(role: str) -> tuple[WorkerSpec, ...]:
            urls, events = list(o.get(role) or []), list(o.get(f"{role}_events") or [])
            if events and len(events) != len(urls):
                raise ConfigError(
                    [
                        f"--{role}-events given {len(events)} times for {len(urls)} --{role} URLs: "
                        "give one per URL, in the same order"
                    ]
                )
            return tuple(WorkerSpec(str(u).rstrip("/"), events[i] if events else None) for i, u in enumerate(urls))

        def get(name: str, default: Any) -> Any:
            v = o.get(name)
            return default if v is None else v

        # With KV events to read (named endpoints, or Kubernetes ports named kv-events), route by cache hit
        # first and load second; without them, by load alone.
        has_events = bool(o.get("prefill_events") or o.get("decode_events")) or get("discovery", "static") == "k8s"
        default_policy = "kv_hit=2,least_loaded" if has_events else "least_loaded"

        return cls(
            host=get("host", "127.0.0.1"),
            port=int(get("port", 8000)),
            prefill=workers("prefill"),
            decode=workers("decode"),
            discovery=get("discovery", "static"),
            k8s=K8sConfig(**{k: type(v)(get(f"k8s_{k}", v)) for k, v in vars(K8sConfig()).items()}),
            routing=RoutingConfig(
                decode=Policy(parse_policy(get("decode_policy", default_policy)), get("decode_picker", "round_robin")),
                prefill=Policy(
                    parse_policy(get("prefill_policy", default_policy)), get("prefill_picker", "round_robin")
                ),
                session_header=str(get("session_header", "x-session-id")).lower(),
            ),
            kv=KVIndexConfig(
                hash_algo=get("kv_hash_algo", "sha256"),
                hash_seed=str(get("kv_hash_seed", DEFAULT_NONE_HASH_SEED)),
                hash_block_size=int(get("kv_hash_block_size", 0)),
                forward_token_ids=bool(get("forward_token_ids", True)),
                grace_s=float(get("kv_index_grace_s", 60.0)),
            ),
            disagg=DisaggConfig(
                enabled=bool(get("disagg", True)),
                min_prompt_tokens=int(get("min_prompt_tokens", 0)),
                min_prompt_chars=int(get("min_prompt_chars", 0)),
                decoder_hit_ratio=float(get("decoder_hit_ratio", 0.8)),
                min_uncached_blocks=float(get("min_uncached_blocks", 1.0)),
                load_aware=bool(get("disagg_load_aware", True)),
                remote_overhead_tokens=int(get("remote_overhead_tokens", 1024)),
            ),
            timeouts=Timeouts(
                **{k: float(get(f"{k.removesuffix('_s')}_timeout", v)) for k, v in vars(Timeouts()).items()}
            ),
            admission=AdmissionConfig(
                max_in_flight=int(get("max_in_flight", 256)),
                max_queue=int(get("max_queue", 1024)),
                queue_timeout_s=float(get("queue_timeout", 30.0)),
            ),
            health=HealthConfig(
                interval_s=float(get("health_interval", 5.0)),
                failures_to_eject=int(get("health_failures", 2)),
                successes_to_readmit=int(get("health_successes", 1)),
                load_interval_s=float(get("load_interval", 1.0)),
            ),
            drain=DrainConfig(delay_s=float(get("drain_delay_s", 5.0)), timeout_s=float(get("drain_timeout_s", 60.0))),
            log_level=str(get("log_level", "INFO")).upper(),
        )


def parse_policy(spec: Any) -> tuple[tuple[str, float], ...]:
    """'kv_hit=2,least_loaded' or ['kv_hit=2', ...] or {'kv_hit': 2} -> (('kv_hit', 2.0), ('least_loaded', 1.0)).
    'none' or '' -> () (pure picker, e.g. round robin)."""
    if isinstance(spec, dict):
        items = [f"{k}={v}" for k, v in spec.items()]
    elif isinstance(spec, (list, tuple)):
        items = [str(s) for s in spec]
    else:
        items = str(spec).split(",")
    out = []
    for item in (i.strip() for i in items):
        if not item or item == "none":
            continue
        name, _, weight = item.partition("=")
        try:
            out.append((name.strip(), float(weight) if weight else 1.0))
        except ValueError:
            raise ConfigError([f"policy item {item!r}: weight must be a number (name=weight)"]) from None
    return tuple(out)
