"""The connector's settings: one frozen object, built once when vLLM creates the connector, validated when built.

Each setting comes from vLLM's `kv_connector_extra_config` when it names it, else from the environment (the
launchers own --kv-transfer-config, so Kubernetes and the launchers set the environment), else its default:

    extra config key    environment                    default    what
    read_timeout_s      HYBRID_PD_READ_TIMEOUT_S       30         a READ's deadline on D, seconds
    lease_s             HYBRID_PD_LEASE_S              120        how long P keeps blocks no decoder read, seconds
    ship_checkpoints    HYBRID_PD_SHIP_CHECKPOINTS     1          ship P's aligned Mamba checkpoint to D
    prefill_to_boundary HYBRID_PD_PREFILL_TO_BOUNDARY  auto       1: P stops at the last block boundary below the
                                                                  prompt's end (one engine step; D computes the
                                                                  rest); 0: at N-1; auto: N-1 on a GPU (D's last
                                                                  token then rides a decode step in a CUDA graph)
                                                                  and where every Mamba layer writes that
                                                                  boundary's state inside the prompt's last chunk,
                                                                  else 1 (connector/vllm_glue.py)
    kv_digests          HYBRID_PD_KV_DIGESTS           1          KV integrity digests (connector/integrity.py):
                                                                  P digests every block it ships; D checks this
                                                                  fraction of the blocks it read (1: all, 0: off,
                                                                  P computes none; between: a sample)
    digest_wait_ms      HYBRID_PD_DIGEST_WAIT_MS       3          D: how long a step's poll waits for the digests of
                                                                  a READ it landed (a GPU computes them beside the
                                                                  step's forward pass); not back by then, the load
                                                                  is reported a step later (0: never wait)
    nixl_backend        HYBRID_PD_NIXL_BACKEND         UCX        UCX or LIBFABRIC
    progress_thread     HYBRID_PD_NIXL_PROGRESS_THREAD 1          NIXL's own progress thread (0: the engine's
                                                                  steps drive the transfers; CPU launchers)
    idle_wait_ms        HYBRID_PD_IDLE_WAIT_MS         0          D: sleep this long in a step that computes
                                                                  nothing while READs are in flight (CPU
                                                                  launchers: 2)
    params_port         HYBRID_PD_PARAMS_PORT          0          D: the port of its params inbox, where the proxy's
                                                                  --early-decode delivers P's params (0: none; it
                                                                  binds the side channel's host)
    await_timeout_s     HYBRID_PD_AWAIT_TIMEOUT_S      120        D: the longest an early decode waits for P's
                                                                  params before it computes the prompt, seconds
    nixl_delay_us       NIXL_PTHR_DELAY_US             1000       NIXL progress thread: sleep between polls, us
                                                                  (NIXL's own is 0: a spinning core per agent)
                        HYBRID_PD_KEEP_AFFINITY        0          CPU engines: keep threads on their --cpu-bind
                                                                  cores (connector/affinity_guard.py)
                        HYBRID_PD_SYNC_SCHEDULER_BLOCK 0          CPU engines: align mode's split ends prefill
                                                                  chunks on the engine's block
                                                                  (connector/scheduler_block.py)
                        VLLM_NIXL_SIDE_CHANNEL_HOST    127.0.0.1  where peers reach this engine's side channel
                        VLLM_NIXL_SIDE_CHANNEL_PORT    5600       its port (+ the TP rank)
                        HYBRID_PD_TEST_CORRUPT_READS   0          tests only: D flips a byte in the first landed
                                                                  block of each run of its first N loads, before
                                                                  it checks them
                        HYBRID_PD_TEST_CORRUPT_KIND    flip       tests only: `flip` as above, or `zero-state`:
                                                                  zero every landed Mamba block instead, or
                                                                  `scramble-attention`: noise in the last landed
                                                                  block of each attention group
                        HYBRID_PD_TRANSFER_RESULTS     (unset)    `legacy`: vLLM < 0.32's failed-load path
                        VLLM_SSM_CONV_STATE_LAYOUT     (unset)    must be DS for a model with Mamba groups

A value that does not parse raises ConfigurationError naming the key (or variable) it came from.

NIXL_PTHR_DELAY_US, HYBRID_PD_KEEP_AFFINITY and HYBRID_PD_SYNC_SCHEDULER_BLOCK also patch processes that are not
ours (vLLM's own NixlConnector builds its NIXL agent and, on CPU, moves threads; vLLM's scheduler splits prefills):
`connector/plugin.py`, loaded by vLLM through its `vllm.general_plugins` entry point
in every process it starts, applies them there, but only where the variable is set, so an engine started
without them (upstream's baseline as its docs run it) is untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from hybrid_pd.connector.errors import ConfigurationError
from hybrid_pd.connector.transport import nixl_backend

T = TypeVar("T")
FALSE_WORDS = ("0", "false", "no")
CORRUPT_KINDS = ("flip", "zero-state", "scramble-attention")  # the test hook's ways of spoiling landed bytes


@dataclass(frozen=True)
class ConnectorConfig:
    side_channel_host: str = "127.0.0.1"
    side_channel_port: int = 5600
    read_timeout_s: float = 30.0
    lease_s: float = 120.0
    ship_checkpoints: bool = True
    nixl_backend: str = "UCX"
    legacy_transfer_results: bool = False
    conv_state_layout: str | None = None
    progress_thread: bool = True
    idle_wait_ms: float = 0.0
    nixl_delay_us: int = 1000
    keep_affinity: bool = False
    sync_scheduler_block: bool = False
    prefill_to_boundary: bool | None = None  # None: auto (vllm_glue.prefill_to_boundary)
    kv_digests: float = 1.0
    digest_wait_ms: float = 3.0
    params_port: int = 0
    await_timeout_s: float = 120.0
    test_corrupt_reads: int = 0
    test_corrupt_kind: str = "flip"

    @classmethod
    def from_sources(cls, extra: Mapping[str, Any], env: Mapping[str, str]) -> ConnectorConfig:
        def setting(key: str | None, var: str, default: T, parse: Callable[[Any], T]) -> T:
            if key is not None and key in extra:
                raw, source = extra[key], f"kv_connector_extra_config {key}"
            elif var in env:
                raw, source = env[var], var
            else:
                return default
            try:
                return parse(raw)
            except (TypeError, ValueError):
                raise ConfigurationError(f"{source}={raw!r}: expected {_WHAT[parse]}") from None

        config = cls(
            side_channel_host=env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1"),
            side_channel_port=setting(None, "VLLM_NIXL_SIDE_CHANNEL_PORT", 5600, int),
            read_timeout_s=setting("read_timeout_s", "HYBRID_PD_READ_TIMEOUT_S", 30.0, float),
            lease_s=setting("lease_s", "HYBRID_PD_LEASE_S", 120.0, float),
            ship_checkpoints=setting("ship_checkpoints", "HYBRID_PD_SHIP_CHECKPOINTS", True, _flag),
            prefill_to_boundary=setting("prefill_to_boundary", "HYBRID_PD_PREFILL_TO_BOUNDARY", None, _auto_flag),
            kv_digests=setting("kv_digests", "HYBRID_PD_KV_DIGESTS", 1.0, float),
            digest_wait_ms=setting("digest_wait_ms", "HYBRID_PD_DIGEST_WAIT_MS", 3.0, float),
            params_port=setting("params_port", "HYBRID_PD_PARAMS_PORT", 0, int),
            await_timeout_s=setting("await_timeout_s", "HYBRID_PD_AWAIT_TIMEOUT_S", 120.0, float),
            test_corrupt_reads=setting(None, "HYBRID_PD_TEST_CORRUPT_READS", 0, int),
            test_corrupt_kind=env.get("HYBRID_PD_TEST_CORRUPT_KIND", "flip"),
            nixl_backend=nixl_backend(extra, env),  # checked in both roles: a typo fails at start-up
            progress_thread=setting("progress_thread", "HYBRID_PD_NIXL_PROGRESS_THREAD", True, _flag),
            idle_wait_ms=setting("idle_wait_ms", "HYBRID_PD_IDLE_WAIT_MS", 0.0, float),
            nixl_delay_us=setting("nixl_delay_us", "NIXL_PTHR_DELAY_US", 1000, int),
            keep_affinity=setting(None, "HYBRID_PD_KEEP_AFFINITY", False, _flag),
            sync_scheduler_block=setting(None, "HYBRID_PD_SYNC_SCHEDULER_BLOCK", False, _flag),
            legacy_transfer_results=env.get("HYBRID_PD_TRANSFER_RESULTS") == "legacy",
            conv_state_layout=env.get("VLLM_SSM_CONV_STATE_LAYOUT"),
        )
        if not 0 <= config.params_port < 65536:
            raise ConfigurationError(f"params_port={config.params_port}: a TCP port, or 0 (no params inbox)")
        timeouts = ("read_timeout_s", config.read_timeout_s), ("lease_s", config.lease_s)
        for name, value in (*timeouts, ("await_timeout_s", config.await_timeout_s)):
            if not value > 0:
                raise ConfigurationError(f"{name}={value}: must be > 0 seconds")
        if not 0 <= config.kv_digests <= 1:
            raise ConfigurationError(f"kv_digests={config.kv_digests}: must be a fraction 0-1 (1: every block, 0: off)")
        if not 0 <= config.digest_wait_ms <= 100:
            raise ConfigurationError(f"digest_wait_ms={config.digest_wait_ms}: must be 0-100 ms (a step's poll waits)")
        if config.test_corrupt_kind not in CORRUPT_KINDS:
            kind = config.test_corrupt_kind
            raise ConfigurationError(f"HYBRID_PD_TEST_CORRUPT_KIND={kind!r}: one of {CORRUPT_KINDS}")
        if config.nixl_delay_us < 0:
            raise ConfigurationError(f"nixl_delay_us={config.nixl_delay_us}: must be >= 0 us")
        if not 0 <= config.idle_wait_ms <= 100:
            raise ConfigurationError(f"idle_wait_ms={config.idle_wait_ms}: must be 0-100 ms")
        return config


def _flag(raw: Any) -> bool:
    return str(raw).lower() not in FALSE_WORDS


def _auto_flag(raw: Any) -> bool | None:
    return None if str(raw).lower() == "auto" else _flag(raw)


_WHAT: dict[Callable[[Any], Any], str] = {int: "an integer", float: "a number"}  # the parsers that can refuse
