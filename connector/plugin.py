"""Our vLLM plugin: the three process patches, applied in every process vLLM starts, only where asked for.

vLLM calls `register()` through the `vllm.general_plugins` entry point (pyproject.toml) in its API server,
engine-core and worker processes, before any KV connector exists; pip installs and removes the entry point
with the package. Each patch is applied only when its variable is set in the environment (the launchers set
both on CPU, NIXL_PTHR_DELAY_US on GPU; connector/config.py declares them and their defaults), so vLLM's own
NixlConnector runs unpatched unless its launch asks otherwise: every comparison says which it ran with.
"""

from __future__ import annotations

import logging
import os

from hybrid_pd.connector.config import ConnectorConfig
from hybrid_pd.connector.errors import ConfigurationError

logger = logging.getLogger("hybrid_pd.connector")
PATCH_VARIABLES = ("NIXL_PTHR_DELAY_US", "HYBRID_PD_KEEP_AFFINITY", "HYBRID_PD_SYNC_SCHEDULER_BLOCK")


def register() -> list[str]:
    """Apply the patches whose variables are set; return their names (vLLM ignores the value)."""
    env = os.environ
    if not any(env.get(var) for var in PATCH_VARIABLES):
        return []
    try:
        config = ConnectorConfig.from_sources({}, env)
    except ConfigurationError as e:  # a typo must not stop a process that may not even use our connector
        logger.warning("hybrid-pd process patches not applied: %s", e)
        return []
    applied = []
    if env.get("NIXL_PTHR_DELAY_US"):
        from hybrid_pd.connector import nixl_delay

        if nixl_delay.install(config.nixl_delay_us):
            applied.append("nixl_delay")
    if config.keep_affinity:
        from hybrid_pd.connector import affinity_guard

        if affinity_guard.install():
            applied.append("affinity_guard")
    if config.sync_scheduler_block:
        from hybrid_pd.connector import scheduler_block

        if scheduler_block.install():
            applied.append("scheduler_block")
    return applied
