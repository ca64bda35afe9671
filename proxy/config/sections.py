"""The sections of the proxy's configuration, one frozen dataclass per component that reads it (routing, the KV
index, the worker pool, timeouts, admission, health checks, Kubernetes discovery, drain), each field declared with
the setting that fills it (declare.py). config/__init__.py composes them into ProxyConfig and validates the whole;
this module imports nothing of the proxy but the declarations and one hash constant, so that every component can
import its section without importing the others (routing's plugins are what composite.py checks names against).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hybrid_pd.connector.contract import DEFAULT_NONE_HASH_SEED

from .declare import above, at_least, boolean, one_of, setting, within

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


PD_POLICIES = ("auto", "ours", "always-remote", "isl-bounding", "non-cached-tokens", "hit-ratio")
PREFILLER_STOPS = ("model", "boundary", "last")


@dataclass(frozen=True)
class DisaggConfig:
    enabled: bool = setting(True, "disagg", "remote prefill at all (off: every request is decode-only)", parse=boolean)
    policy: str = setting(
        "auto",
        "pd_policy",
        "who decides where a turn's prompt is computed, once its decoder is chosen: ours (placement/cost_model.py: the "
        "least predicted TTFT within --itl-slo-ms, from every worker's attention + checkpoint hit and load); "
        "always-remote (upstream's toy proxy); isl-bounding (Dynamo's conditional disaggregation: the decoder "
        "alone under --isl-max-tokens and --isl-ratio of uncached input); non-cached-tokens (llm-d's prefix-based "
        "PD decider: a prefiller from --non-cached-tokens uncached tokens); hit-ratio (deprecated: the "
        "decoder alone from --decoder-hit-ratio of the prompt, 0.8 unless given). The peers' deciders read "
        "attention-only hits, as theirs do. auto: ours, or hit-ratio where --decoder-hit-ratio is given",
        choices=PD_POLICIES,
        check=one_of(*PD_POLICIES),
    )
    itl_slo_ms: float = setting(
        0.0,
        "itl_slo_ms",
        "policy ours: the longest inter-token gap a turn may cause the decoder's running streams (its prefill on "
        "the decoder stalls each of them for about its duration); within it, the least TTFT wins. 0: no bound; "
        "the least total delay (the turn's TTFT plus each running stream's stall) wins",
        parse=float,
        check=at_least(0),
    )
    shared_device: bool = setting(
        False, "shared_device", "policy ours: P and D on one GPU, a prefill on P stalls D's streams too", parse=boolean
    )
    shared_device_stall: float = setting(
        1.0,
        "shared_device_stall",
        "with --shared-device: the share of P's prefill D's streams wait for (1: all)",
        parse=float,
        check=within(0, 1),
    )
    next_turn: bool = setting(
        True,
        "next_turn",
        "policy ours: the decoder alone carries what it leaves a conversation's next turn, the prefiller's recompute "
        "of what it computed times the recent share of turns that went on on a prefiller",
        parse=boolean,
    )
    prefiller_queue: bool = setting(
        True,
        "prefiller_queue",
        "policy ours: a remote option carries the delay its prefill adds to the requests that queue behind it on "
        "the prefiller (as many as it finds there), as the decoder alone carries its stall of the decoder's streams",
        parse=boolean,
    )
    learn_local_alone: bool = setting(
        False,
        "learn_local_alone",
        "policy ours: a turn the decoder served alone teaches the prefill rates only where nothing else was on the "
        "decoder until its first token, as a prefiller's call does (its TTFT then times a prefill, not a prefill "
        "queued behind other streams' steps); off: every such turn does",
        parse=boolean,
    )
    align_split: bool = setting(
        False,
        "align_split",
        "policy ours: the engines' align mode ends a prefill step at the last aligned boundary below a prompt's end "
        "and computes the rest in one more (vLLM before 0.32, and layers without prefill checkpoints, e.g. 0.33's GDN "
        "on Triton); off: the state there is written inside the prompt's last chunk, a step fewer in the cost "
        "model's prices. Until a prefiller says: hybrid-pd's prefillers tell with every answer, and that wins",
        parse=boolean,
    )
    prefiller_stop: str = setting(
        "model",
        "prefiller_stop",
        "where a prefiller stops computing a remote turn's prompt of a hybrid model: model (policy ours: whichever "
        "the cost model prices lower; the other policies: the prefiller's own setting, HYBRID_PD_PREFILL_TO_BOUNDARY, "
        "auto by default); boundary (the last aligned boundary below the prompt's end: the decoder computes the rest "
        "in a prefill step of its own); last (one token short: the decoder computes the last token in a "
        "decode-shaped step)",
        choices=PREFILLER_STOPS,
        check=one_of(*PREFILLER_STOPS),
    )
    junction_checkpoints: bool = setting(
        True,
        "junction_checkpoints",
        "policy ours, chat: where a remote turn diverged from the decoder's cache past the decoder's last "
        "checkpoint (an agent loop whose next turn drops a fixed last instruction), the prefiller stops where the "
        "last message starts and that state crosses for the decoder to keep; the decoder computes the last "
        "message itself, and the next turn, diverging there, hits it",
        parse=boolean,
    )
    min_prompt_tokens: int = setting(
        0,
        "min_prompt_tokens",
        "prefill shorter prompts on the decoder (needs tokenization)",
        parse=int,
        check=at_least(0),
    )
    min_prompt_chars: int = setting(
        0, "min_prompt_chars", "prefill shorter prompts (characters) on the decoder", parse=int, check=at_least(0)
    )
    decoder_hit_ratio: float = setting(
        0.0,
        "decoder_hit_ratio",
        "deprecated (policy hit-ratio, which giving it selects): prefill on the decoder when it already holds this "
        "share of the prompt (0: not set). Measured: a decoder holding 0.71 of a turn computed its tail in 117 ms "
        "where the prefiller took 146 ms (H100, 2026-11-24 run); policy ours decides in time instead",
        parse=float,
        check=within(0, 1),
    )
    min_uncached_blocks: float = setting(
        1.0,
        "min_uncached_blocks",
        "policy hit-ratio: prefill on the decoder when what it lacks (past its attention + checkpoint "
        "hit) is under this many aligned blocks (0: off; needs KV events)",
        parse=float,
        check=at_least(0),
    )
    load_aware: bool = setting(
        True,
        "disagg_load_aware",
        "policy hit-ratio: apply the two rules above only while prefilling on the decoder delays its "
        "running streams less than a remote prefill would cost (see --remote-overhead-tokens)",
        parse=boolean,
    )
    remote_overhead_tokens: int = setting(
        1024,
        "remote_overhead_tokens",
        "policy hit-ratio: a remote prefill's fixed cost (hop to P, READ, the decoder's wait) in "
        "tokens of prefill compute (1024: ~30 ms of an H200 at Qwen3-Next shapes)",
        parse=int,
        check=at_least(0),
    )
    isl_max_tokens: int = setting(
        2048,
        "isl_max_tokens",
        "policy isl-bounding: the decoder alone under this many uncached tokens (Dynamo's eff_isl_threshold) ...",
        parse=int,
        check=at_least(0),
    )
    isl_ratio: float = setting(
        0.7,
        "isl_ratio",
        "policy isl-bounding: ... and under this share of the prompt (Dynamo's eff_isl_ratio_threshold)",
        parse=float,
        check=within(0, 1),
    )
    non_cached_tokens: int = setting(
        128,
        "non_cached_tokens",
        "policy non-cached-tokens: a prefiller from this many uncached tokens (llm-d's nonCachedTokens; 128 = 8 "
        "of its prefix plugin's 16-token blocks)",
        parse=int,
        check=at_least(0),
    )
    warm_pairs: bool = setting(
        False,
        "warm_pairs",
        "send each admitted prefiller/decoder pair one short PD request of the proxy's own before clients' (the "
        "first READ between two engines takes ~1 s: handshake, memory mapping, first kernels); /health answers "
        "503 until the first ones end (90 s at most)",
        parse=boolean,
    )
    log_placement: bool = setting(
        False,
        "log_placement",
        "policy ours: log each turn's placement at INFO (every option's predicted TTFT, stall and cost, the choice) "
        "and, once the turn has ended, the TTFT it had, P's call against its price and the factor on P's call learned",
        parse=boolean,
    )
    early_decode: bool = setting(
        False,
        "early_decode",
        "a remote turn's decode request goes to the decoder together with the prefill request, not after P's "
        "answer: the decoder admits and tokenizes it while P computes, and the proxy delivers P's params (or P's "
        "failure: the decoder computes the prompt) to its params inbox (--decode-inbox); decoders without one are "
        "served in turn as before",
        parse=boolean,
    )
    usage_breakdown: bool = setting(
        True,
        "usage_breakdown",
        "add usage.hybrid_pd to answers: what the prefiller hit, what the decoder hit, where the prompt was "
        "computed (usage.prompt_tokens_details.cached_tokens is unchanged)",
        parse=boolean,
    )

    @property
    def pd_policy(self) -> str:
        """The policy in force: auto is ours, or hit-ratio where --decoder-hit-ratio is given."""
        if self.policy == "auto":
            return "hit-ratio" if self.decoder_hit_ratio > 0 else "ours"
        return self.policy


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
