"""What the launcher reads before vLLM starts: the installed vLLM's source (read, not imported), the model's
config.json, whether a port is free. No vLLM import, so the checks run without an engine.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Literal

HYBRID_LAYER_KINDS = {"linear_attention", "mamba", "mamba2", "ssm", "conv", "short_conv", "gdn"}
HYBRID_ARCHITECTURES = {
    "Qwen3NextForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration",
    "NemotronHForCausalLM",
    "GraniteMoeHybridForCausalLM",
    "FalconH1ForCausalLM",
    "JambaForCausalLM",
    "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM",
    "Zamba2ForCausalLM",
    "BambaForCausalLM",
    "Plamo2ForCausalLM",
}


def vllm_source(module_path: str) -> str:
    """The installed vLLM's source of one module ('v1/core/kv_cache_utils.py'), read instead of imported (the
    launcher decides vLLM's flags before vLLM starts); '' if there is none."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return ""
    try:
        return (Path(list(spec.submodule_search_locations)[0]) / module_path).read_text()
    except OSError:
        return ""


def vllm_none_hash_is_random(source: str | None = None) -> bool:
    """True when the installed vLLM seeds NONE_HASH with random bytes if PYTHONHASHSEED is unset (< 0.27; later
    releases fall back to the fixed "vllm-none-hash")."""
    if source is None:
        source = vllm_source("v1/core/kv_cache_utils.py")
    return "NONE_HASH = BlockHash(os.urandom" in source and "DEFAULT_NONE_HASH_SEED" not in source


def vllm_has_retention_interval(source: str | None = None) -> bool:
    """True when the installed vLLM has `--prefix-cache-retention-interval` (0.32 has it, 0.26 does not). Without
    it, align mode already keeps the Mamba state at the end of every scheduler step that ends on a block boundary
    (0.26's CacheConfig.mamba_cache_mode), so capping the step at the interval is the whole of --checkpoint-every;
    passing the flag there would make vLLM refuse to start."""
    if source is None:
        source = vllm_source("config/cache.py")
    return "prefix_cache_retention_interval" in source


MAMBA_CACHE_MODE_DEPRECATED = "--mamba-cache-mode is deprecated"


def vllm_ignores_mamba_cache_mode(source: str | None = None) -> bool:
    """True when the installed vLLM deprecates --mamba-cache-mode (0.33: "It has no effect: Mamba prefix caching
    follows --enable-prefix-caching", in align mode for the hybrids; the GPU run of 2026-11-26 logged it so). The
    launcher then leaves the flag out: there it only warns, and the release that drops it would refuse it."""
    if source is None:
        source = vllm_source("engine/arg_utils.py")
    return MAMBA_CACHE_MODE_DEPRECATED in source


def model_kind(model: str) -> Literal["hybrid", "attention", "unknown"]:
    """Read a local model's config.json: 'hybrid' if it mixes Mamba/linear-attention and attention layers."""
    path = Path(model) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError):
        return "unknown"
    text_cfg = cfg.get("text_config", cfg)
    if set(cfg.get("architectures") or []) & HYBRID_ARCHITECTURES:
        return "hybrid"
    kinds = {str(k).lower() for k in (text_cfg.get("layer_types") or text_cfg.get("layers_block_type") or [])}
    if kinds & HYBRID_LAYER_KINDS or "M" in str(text_cfg.get("hybrid_override_pattern", "")):
        return "hybrid"
    return "attention"


def port_is_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
