"""Where the proxy's options come from: a JSON file (`--config`), the environment, the command line.

Later sources win: file < environment (`HYBRID_PD_PROXY_<NAME>`, e.g. HYBRID_PD_PROXY_MAX_QUEUE=64; list options
take a comma-separated value) < flags. Every source uses the same flat names (a flag's name with `_`), so a
JSON file reads like {"decode": ["http://10.0.0.2:8200"], "decode_policy": "kv_hit=2,least_loaded"}.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..errors import ConfigError
from . import ProxyConfig

ENV_PREFIX = "HYBRID_PD_PROXY_"
LIST_OPTIONS = ("prefill", "decode", "prefill_events", "decode_events")
BOOL_OPTIONS = ("disagg", "forward_token_ids", "disagg_load_aware")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hybrid-pd proxy",
        description="OpenAI-compatible PD routing proxy "
        "for hybrid Mamba/attention models (decode-first, cache- and hybrid-aware).",
        argument_default=argparse.SUPPRESS,
    )
    a = p.add_argument
    a("--config", help='JSON file of options (flat names, e.g. {"max_queue": 64}); flags override it')
    a("--host", help="address to bind (default 127.0.0.1)")
    a("--port", type=int, help="port to bind (default 8000; 0 picks a free one)")
    g = p.add_argument_group("workers")
    g.add_argument("--prefill", action="append", metavar="URL", help="prefill worker base URL (repeatable)")
    g.add_argument("--decode", action="append", metavar="URL", help="decode worker base URL (repeatable)")
    g.add_argument(
        "--prefill-events",
        action="append",
        metavar="ZMQ",
        help="each prefill worker's KV-event endpoint, same order as --prefill: tcp://host:port; "
        "a loopback one is bound by the proxy (vLLM connects to it unless its endpoint is tcp://*:port), "
        "others are connected to; force with a bind: or connect: prefix",
    )
    g.add_argument(
        "--decode-events",
        action="append",
        metavar="ZMQ",
        help="each decode worker's KV-event endpoint, same order as --decode (as --prefill-events)",
    )
    g.add_argument("--discovery", choices=["static", "k8s"], help="static list (default) or Kubernetes")
    for name, text in (
        ("api-url", "Kubernetes API URL (default: in-cluster)"),
        ("namespace", "namespace"),
        ("prefill-selector", "label selector of prefill Services"),
        ("decode-selector", "label selector of decode Services"),
        ("http-port-name", "Endpoints port name of the OpenAI API"),
        ("events-port-name", "Endpoints port name of the KV events"),
        ("token-file", "service-account token file"),
        ("ca-file", "API server CA file"),
    ):
        g.add_argument(f"--k8s-{name}", help=text)
    g.add_argument(
        "--k8s-poll-interval-s", type=float, help="seconds between EndpointSlice lists while the watch fails (10)"
    )
    g.add_argument("--k8s-watch-timeout-s", type=float, help="seconds before a watch is renewed (300)")
    r = p.add_argument_group("routing")
    r.add_argument(
        "--decode-policy",
        help="weighted scorers for decoders, e.g. 'session_affinity=4,kv_hit=2,"
        "least_loaded' (scorers: least_loaded, session_affinity, kv_hit, queue_cost; 'none': the picker alone). "
        "Default: kv_hit=2,least_loaded with KV events (--*-events or k8s), else least_loaded",
    )
    r.add_argument("--prefill-policy", help="weighted scorers for prefillers (same syntax)")
    r.add_argument("--decode-picker", help="picker among the best scores: round_robin (default) or first")
    r.add_argument("--prefill-picker", help="picker for prefillers")
    r.add_argument(
        "--session-header",
        help="header naming a session for session_affinity (x-session-id); "
        "the OpenAI `user` field is used when it is absent",
    )
    k = p.add_argument_group("KV index")
    k.add_argument("--kv-hash-algo", choices=["sha256", "sha256_cbor"], help="the workers' prefix-caching hash")
    k.add_argument("--kv-hash-seed", help="the workers' PYTHONHASHSEED, if set (default: vllm-none-hash)")
    k.add_argument("--kv-hash-block-size", type=int, help="vLLM hash_block_size (0: learn from events)")
    k.add_argument(
        "--kv-index-grace-s",
        type=float,
        help="keep a removed worker's KV index this long, for the same worker coming back (60)",
    )
    k.add_argument(
        "--forward-token-ids",
        action=argparse.BooleanOptionalAction,
        help="send the tokenized prompt to the workers (completions; default on)",
    )
    d = p.add_argument_group("conditional disaggregation")
    d.add_argument("--disagg", action=argparse.BooleanOptionalAction, help="remote prefill at all (default on)")
    d.add_argument("--min-prompt-tokens", type=int, help="prefill shorter prompts on the decoder")
    d.add_argument("--min-prompt-chars", type=int, help="prefill shorter prompts (characters) on the decoder")
    d.add_argument(
        "--min-uncached-blocks",
        type=float,
        help="prefill on the decoder when what it lacks (past its attention + checkpoint hit) is under "
        "this many aligned blocks (1; 0: off; needs KV events)",
    )
    d.add_argument(
        "--decoder-hit-ratio",
        type=float,
        help="prefill on the decoder when it already holds this share of the prompt (0.8)",
    )
    d.add_argument(
        "--disagg-load-aware",
        action=argparse.BooleanOptionalAction,
        help="apply the two rules above only while prefilling on the decoder delays its running streams less "
        "than a remote prefill would cost (default on; see --remote-overhead-tokens)",
    )
    d.add_argument(
        "--remote-overhead-tokens",
        type=int,
        help="a remote prefill's fixed cost (hop to P, READ, the decoder's wait) in tokens of prefill compute "
        "(1024: ~30 ms of an H200 at Qwen3-Next shapes)",
    )
    t = p.add_argument_group("timeouts (seconds)")
    for name in ("connect", "prefill", "decode-first-byte", "total", "tokenize", "health"):
        t.add_argument(f"--{name}-timeout", type=float)
    q = p.add_argument_group("admission and health")
    q.add_argument("--max-in-flight", type=int, help="requests served at once (256)")
    q.add_argument("--max-queue", type=int, help="requests waiting beyond that; more get 429 (1024)")
    q.add_argument("--queue-timeout", type=float, help="longest wait in the queue before 429 (30 s)")
    q.add_argument("--health-interval", type=float, help="seconds between active health checks (0: off)")
    q.add_argument("--health-failures", type=int, help="consecutive failures that eject a worker (2)")
    q.add_argument("--health-successes", type=int, help="consecutive successes that re-admit it (1)")
    q.add_argument(
        "--load-interval",
        type=float,
        help="seconds between reads of each worker's own load from its /metrics (running and waiting requests, "
        "KV-cache use), so that proxy replicas agree on it (1; 0: count only this proxy's requests)",
    )
    s = p.add_argument_group("shutdown (SIGTERM; a second SIGTERM or SIGINT stops at once)")
    s.add_argument(
        "--drain-delay-s",
        type=float,
        help="after SIGTERM /health answers 503 and new requests are still served this long (5)",
    )
    s.add_argument(
        "--drain-timeout-s",
        type=float,
        help="then open requests and streams get this long to finish; the rest are cut (60)",
    )
    p.add_argument("--log-level", help="DEBUG, INFO, WARNING")
    return p


def options_from_env(env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in LIST_OPTIONS:
            out[name] = [v.strip() for v in value.split(",") if v.strip()]
        elif name in BOOL_OPTIONS:
            out[name] = value.strip().lower() in ("1", "true", "yes", "on")
        else:
            out[name] = value
    return out


def options_from_file(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError([f"--config {path}: cannot read a JSON object ({e})"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"--config {path}: the file must hold a JSON object of options"])
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_config(argv: list[str], env: dict[str, str] | None = None) -> ProxyConfig:
    """CLI argv (without the program name) + environment + optional JSON file -> one validated config."""
    flags = vars(build_parser().parse_args(argv))
    env_opts = options_from_env(dict(os.environ) if env is None else env)
    path = flags.pop("config", None) or env_opts.pop("config", None)
    merged: dict[str, Any] = options_from_file(path) if path else {}
    merged.update(env_opts)
    merged.update(flags)
    try:
        return ProxyConfig.from_flat(merged)
    except (TypeError, ValueError) as e:  # a value of the wrong type in the file or environment
        raise ConfigError([f"option value of the wrong type: {e}"]) from None
