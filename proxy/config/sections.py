"""The sections of the proxy's configuration, one frozen dataclass per component that reads it (routing, the KV
index, the worker pool, timeouts, admission, health checks, Kubernetes discovery, drain). config.py composes them
into ProxyConfig and validates the whole; this module imports nothing of the proxy, so that every component can
import its section without importing the others (routing's plugins are what config.py checks names against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..kv.block_hash import DEFAULT_NONE_HASH_SEED

HashAlgo = Literal["sha256", "sha256_cbor"]


@dataclass(frozen=True)
class WorkerSpec:
    url: str  # http://host:port, no trailing slash
    events: str | None = None  # the worker's vLLM KV-event endpoint, [bind:|connect:]tcp://host:port
    identity: str | None = None  # its engine's identity where discovery knows one (a pod UID)
    terminating: bool = False  # going away but still serving: no new requests, nothing torn down


def same_engine(a: str | None, b: str | None) -> bool:
    """Two identities of the engine at one URL name the same engine unless both are known and differ."""
    return a is None or b is None or a == b


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = 5.0
    prefill_s: float = 120.0  # the whole prefill call (P answers only when its prompt is computed)
    decode_first_byte_s: float = 120.0  # until D's first response byte (its prefill or KV pull included)
    total_s: float = 600.0  # the whole request, streaming included
    tokenize_s: float = 5.0
    health_s: float = 2.0


@dataclass(frozen=True)
class Policy:
    """A weighted list of scorer plugin names, e.g. (("kv_hit", 2.0), ("least_loaded", 1.0)), and a picker."""

    scorers: tuple[tuple[str, float], ...] = ()
    picker: str = "round_robin"

    def uses(self, name: str) -> bool:
        return any(n == name for n, _ in self.scorers)


@dataclass(frozen=True)
class RoutingConfig:
    decode: Policy = Policy((("least_loaded", 1.0),))
    prefill: Policy = Policy((("least_loaded", 1.0),))
    session_header: str = "x-session-id"

    def uses(self, name: str) -> bool:
        return self.decode.uses(name) or self.prefill.uses(name)


@dataclass(frozen=True)
class KVIndexConfig:
    hash_algo: HashAlgo = "sha256"  # vLLM's --prefix-caching-hash-algo; non-crypto ones are not reproducible
    hash_seed: str = DEFAULT_NONE_HASH_SEED  # PYTHONHASHSEED of the workers, when they set one
    hash_block_size: int = 0  # vLLM's hash_block_size; 0: learn it from the workers' events
    forward_token_ids: bool = True  # send the tokenized prompt to P and D (completions only)
    grace_s: float = 60.0  # a removed worker's index is kept this long, for the same worker coming back


@dataclass(frozen=True)
class DisaggConfig:
    enabled: bool = True  # False: every request is decode-only
    min_prompt_tokens: int = 0  # shorter prompts are prefilled on D (needs tokenization to apply)
    min_prompt_chars: int = 0  # shorter prompts (characters of text) are prefilled on D
    decoder_hit_ratio: float = 0.8  # D already holds >= this share of the prompt (KV index): prefill on D
    min_uncached_blocks: float = 1.0  # D lacks fewer aligned blocks than this: prefill on D (0: off)
    load_aware: bool = True  # the two rules above only when D's prefill costs its streams less than P (disagg.py)
    remote_overhead_tokens: int = 1024  # the remote path's fixed cost (hop, READ, D's wait) in prefill tokens


@dataclass(frozen=True)
class AdmissionConfig:
    max_in_flight: int = 256
    max_queue: int = 1024
    queue_timeout_s: float = 30.0


@dataclass(frozen=True)
class HealthConfig:
    interval_s: float = 5.0  # 0 disables active health checks
    failures_to_eject: int = 2
    successes_to_readmit: int = 1
    load_interval_s: float = 1.0  # reads of each worker's own load (engine_load.py); 0: this proxy's count only


@dataclass(frozen=True)
class K8sConfig:
    api_url: str = ""  # default: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT
    namespace: str = "default"
    prefill_selector: str = "hybrid-pd/role=prefill"
    decode_selector: str = "hybrid-pd/role=decode"
    http_port_name: str = "http"
    events_port_name: str = "kv-events"
    token_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    ca_file: str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
    poll_interval_s: float = 10.0  # between lists while the watch fails (the watch itself follows at once)
    watch_timeout_s: float = 300.0  # a watch is renewed from its resourceVersion after this long


@dataclass(frozen=True)
class DrainConfig:
    """On SIGTERM: /health answers 503 at once; new requests are still served for `delay_s` (while the
    endpoints' removal propagates), then the listener closes and open requests get `timeout_s` to finish."""

    delay_s: float = 5.0
    timeout_s: float = 60.0
