"""The sections of the proxy's configuration, one frozen dataclass per component that reads it (routing, the KV
index, the worker pool, timeouts, admission, health checks, Kubernetes discovery, drain; the PD section is
disagg.py's), each field declared with the setting that fills it (declare.py). config/__init__.py composes them into
ProxyConfig and validates the whole; this module imports nothing of the proxy but the declarations and one hash
constant, so that every component can import its section without importing the others (routing's plugins are what
composite.py checks names against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybrid_pd.connector.contract import DEFAULT_NONE_HASH_SEED

from .declare import above, at_least, boolean, one_of, setting

HashAlgo = Literal["sha256", "sha256_cbor"]


@dataclass(frozen=True)
class WorkerSpec:
    url: str  # http://host:port, no trailing slash
    events: str | None = None  # the worker's vLLM KV-event endpoint, [bind:|connect:]tcp://host:port
    inbox: str | None = None  # a decoder's params inbox for early decode, tcp://host:port (its --params-port)
    identity: str | None = None  # its engine's identity where discovery knows one (a pod UID)
    terminating: bool = False  # going away but still serving: no new requests, nothing torn down


def same_engine(a: str | None, b: str | None) -> bool:
    """Two identities of the engine at one URL name the same engine unless both are known and differ."""
    return a is None or b is None or a == b


@dataclass(frozen=True)
class Timeouts:
    connect_s: float = setting(5.0, "connect_timeout", "opening a connection to a worker", parse=float, check=above(0))
    prefill_s: float = setting(
        120.0,
        "prefill_timeout",
        "the whole prefill call (P answers once the prompt is computed)",
        parse=float,
        check=above(0),
    )
    decode_first_byte_s: float = setting(
        120.0,
        "decode_first_byte_timeout",
        "until D's first response byte (its prefill or KV pull included)",
        parse=float,
        check=above(0),
    )
    total_s: float = setting(
        600.0, "total_timeout", "the whole request, streaming included", parse=float, check=above(0)
    )
    tokenize_s: float = setting(5.0, "tokenize_timeout", "POST /tokenize on a worker", parse=float, check=above(0))
    health_s: float = setting(2.0, "health_timeout", "one health check", parse=float, check=above(0))


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
    session_header: str = setting(
        "x-session-id",
        "session_header",
        "header naming a session for session_affinity; the OpenAI `user` field is used when it is absent",
        parse=lambda v: str(v).lower(),
        check=lambda v: None if v and v.isascii() else "must be a non-empty ASCII header name",
    )

    def uses(self, name: str) -> bool:
        return self.decode.uses(name) or self.prefill.uses(name)


@dataclass(frozen=True)
class KVIndexConfig:
    hash_algo: HashAlgo = setting(
        "sha256",
        "kv_hash_algo",
        "the workers' prefix-caching hash (vLLM's --prefix-caching-hash-algo)",
        choices=("sha256", "sha256_cbor"),
        check=one_of(
            "sha256",
            "sha256_cbor",
            why=": only these are reproducible across processes (xxhash uses a random per-process seed)",
        ),
    )
    hash_seed: str = setting(DEFAULT_NONE_HASH_SEED, "kv_hash_seed", "the workers' PYTHONHASHSEED, if they set one")
    hash_block_size: int = setting(
        0,
        "kv_hash_block_size",
        "vLLM's hash_block_size (0: learn it from the workers' events)",
        parse=int,
        check=at_least(0),
    )
    forward_token_ids: bool = setting(
        True, "forward_token_ids", "send the tokenized prompt to the workers (completions)", parse=boolean
    )
    tokenizer: str = setting(
        "auto",
        "tokenizer",
        "where prompts are tokenized when routing needs their ids: 'auto' (the model folder the decoders name in "
        "/v1/models, when this machine can read it), a model folder or Hugging Face id (its tokenizer and chat "
        "template, loaded by the proxy), or 'remote' (POST /tokenize on a worker per request); the proxy falls "
        "back to 'remote' while a local tokenizer is not loaded and for request shapes it does not reproduce",
        check=lambda v: None if v else "must not be empty",
    )
    grace_s: float = setting(
        60.0,
        "kv_index_grace_s",
        "keep a removed worker's KV index this long, for the same worker coming back (0: it goes at once)",
        parse=float,
        check=at_least(0),
    )


@dataclass(frozen=True)
class AdmissionConfig:
    max_in_flight: int = setting(256, "max_in_flight", "requests served at once", parse=int, check=at_least(1))
    max_queue: int = setting(
        1024, "max_queue", "requests waiting beyond that; more get 429", parse=int, check=at_least(0)
    )
    queue_timeout_s: float = setting(
        30.0, "queue_timeout", "longest wait in the queue before 429, seconds", parse=float, check=above(0)
    )


@dataclass(frozen=True)
class HealthConfig:
    interval_s: float = setting(
        5.0, "health_interval", "seconds between active health checks (0: off)", parse=float, check=at_least(0)
    )
    failures_to_eject: int = setting(
        2, "health_failures", "consecutive failures that eject a worker", parse=int, check=at_least(1)
    )
    successes_to_readmit: int = setting(
        1, "health_successes", "consecutive successes that re-admit it", parse=int, check=at_least(1)
    )
    load_interval_s: float = setting(
        1.0,
        "load_interval",
        "seconds between reads of each worker's own load from its /metrics (running and "
        "waiting requests, KV-cache use), so that proxy replicas agree on it (engine_load.py; 0: count only this "
        "proxy's requests)",
        parse=float,
        check=at_least(0),
    )


@dataclass(frozen=True)
class K8sConfig:
    api_url: str = setting(
        "", "k8s_api_url", "Kubernetes API URL (default: in-cluster, https://$KUBERNETES_SERVICE_HOST:$..._PORT)"
    )
    namespace: str = setting("default", "k8s_namespace", "namespace")
    prefill_selector: str = setting(
        "hybrid-pd/role=prefill", "k8s_prefill_selector", "label selector of prefill Services"
    )
    decode_selector: str = setting("hybrid-pd/role=decode", "k8s_decode_selector", "label selector of decode Services")
    http_port_name: str = setting("http", "k8s_http_port_name", "Endpoints port name of the OpenAI API")
    events_port_name: str = setting("kv-events", "k8s_events_port_name", "Endpoints port name of the KV events")
    inbox_port_name: str = setting(
        "params-inbox", "k8s_inbox_port_name", "Endpoints port name of a decoder's params inbox (--early-decode)"
    )
    token_file: str = setting(
        "/var/run/secrets/kubernetes.io/serviceaccount/token", "k8s_token_file", "service-account token file"
    )
    ca_file: str = setting("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt", "k8s_ca_file", "API server CA file")
    poll_interval_s: float = setting(
        10.0,
        "k8s_poll_interval_s",
        "seconds between EndpointSlice lists while the watch fails (the watch itself follows at once)",
        parse=float,
        check=above(0),
    )
    watch_timeout_s: float = setting(
        300.0,
        "k8s_watch_timeout_s",
        "seconds before a watch is renewed from its resourceVersion",
        parse=float,
        check=above(0),
    )


@dataclass(frozen=True)
class DrainConfig:
    """On SIGTERM: /health answers 503 at once; new requests are still served for `delay_s` (while the
    endpoints' removal propagates), then the listener closes and open requests get `timeout_s` to finish."""

    delay_s: float = setting(
        5.0,
        "drain_delay_s",
        "after SIGTERM /health answers 503 and new requests are still served this long",
        parse=float,
        check=at_least(0),
    )
    timeout_s: float = setting(
        60.0,
        "drain_timeout_s",
        "then open requests and streams get this long to finish; the rest are cut",
        parse=float,
        check=at_least(0),
    )
