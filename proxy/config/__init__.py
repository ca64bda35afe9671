"""The proxy's one frozen configuration object, validated when built.

`ProxyConfig.from_flat(options)` takes the flat option names that the CLI flags, the environment
(`HYBRID_PD_PROXY_<NAME>`) and the JSON `--config` file share (sources.py) and refuses a broken value or
combination with a `ConfigError` that names the flag to change. Every setting is declared once, on its field
(here and in sections.py) or in composite.py; declare.py builds the construction and the per-field checks from
the declarations, and problems() adds the rules that span fields.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from hybrid_pd.connector.contract import DEFAULT_NONE_HASH_SEED

from ..errors import ConfigError
from .composite import COMPOSITES
from .declare import complaints, flat_fields, one_of, setting
from .disagg import DisaggConfig
from .sections import (
    AdmissionConfig,
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

# The sections are importable from here too (sections.py holds them so that components import no cycle).
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
    host: str = setting("127.0.0.1", "host", "address to bind")
    port: int = setting(
        8000,
        "port",
        "port to bind (0 picks a free one)",
        parse=int,
        check=lambda v: None if 0 <= v <= 65535 else "is not a TCP port",
    )
    prefill: tuple[WorkerSpec, ...] = ()  # composite.py: --prefill, --prefill-events
    decode: tuple[WorkerSpec, ...] = ()  # composite.py: --decode, --decode-events, --decode-inbox
    discovery: Literal["static", "k8s"] = setting(
        "static",
        "discovery",
        "a static worker list or Kubernetes EndpointSlices",
        choices=("static", "k8s"),
        check=one_of("static", "k8s"),
    )
    k8s: K8sConfig = field(default_factory=K8sConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    kv: KVIndexConfig = field(default_factory=KVIndexConfig)
    disagg: DisaggConfig = field(default_factory=DisaggConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    log_level: str = setting(
        "INFO",
        "log_level",
        "DEBUG, INFO, WARNING, ERROR or CRITICAL",
        parse=lambda v: str(v).upper(),
        check=one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    )

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise ConfigError(problems)

    @functools.cached_property
    def tokenize(self) -> bool:
        """Prompts are tokenized (the proxy's tokenizer, or a worker's /tokenize) only when a policy or threshold
        needs the ids. (Read per request: computed once.)"""
        by_hit = self.routing.uses("kv_hit") or self.routing.uses("queue_cost")
        return by_hit or (self.disagg.enabled and self.disagg.min_prompt_tokens > 0)

    def problems(self) -> list[str]:
        """Each setting's own check (declared with it), then the rules that span settings."""
        out = complaints(self)
        for composite in COMPOSITES:
            s = composite.setting
            out += [f"{s.flag} {v!r} {c}" for v in composite.values(self) if s.check and (c := s.check(v))]
        d = self.disagg
        if d.decoder_hit_ratio > 0 and d.policy not in ("auto", "hit-ratio"):
            out.append(
                f"--decoder-hit-ratio belongs to --pd-policy hit-ratio (deprecated), not {d.policy}: drop it, or "
                "pass --pd-policy hit-ratio"
            )
        if self.discovery == "static" and not self.decode:
            out.append("no decode worker: pass --decode URL (repeatable) or --discovery k8s")
        if self.discovery == "k8s" and not self.k8s.api_url and not os.environ.get("KUBERNETES_SERVICE_HOST"):
            out.append("--discovery k8s outside a pod (no KUBERNETES_SERVICE_HOST): pass --k8s-api-url")
        return out

    @classmethod
    def from_flat(cls, o: dict[str, Any]) -> ProxyConfig:
        """Build from flat option names (the CLI flag names with `_`; declared in sections.py, composite.py and
        on this class's fields): a setting not given keeps its field's default."""

        def workers(role: str) -> tuple[WorkerSpec, ...]:
            urls, events = list(o.get(role) or []), list(o.get(f"{role}_events") or [])
            inboxes = list(o.get("decode_inbox") or []) if role == "decode" else []
            for name, given in ((f"--{role}-events", events), ("--decode-inbox", inboxes)):
                if given and len(given) != len(urls):
                    many = f"{name} given {len(given)} times for {len(urls)} --{role} URLs"
                    raise ConfigError([f"{many}: give one per URL, in the same order"])
            return tuple(
                WorkerSpec(str(u).rstrip("/"), events[i] if events else None, inboxes[i] if inboxes else None)
                for i, u in enumerate(urls)
            )

        # With KV events to read (named endpoints, or Kubernetes ports named kv-events), route by cache hit
        # first and load second; without them, by load alone.
        has_events = bool(o.get("prefill_events") or o.get("decode_events")) or o.get("discovery") == "k8s"
        default_policy = "kv_hit=2,least_loaded" if has_events else "least_loaded"

        def policy(role: str) -> Policy:
            scorers = parse_policy(o[f"{role}_policy"] if o.get(f"{role}_policy") is not None else default_policy)
            picker = o.get(f"{role}_picker")
            return Policy(scorers) if picker is None else Policy(scorers, str(picker))

        flat = flat_fields(cls, o)
        flat["routing"] = dataclasses.replace(flat["routing"], decode=policy("decode"), prefill=policy("prefill"))
        return cls(prefill=workers("prefill"), decode=workers("decode"), **flat)


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
