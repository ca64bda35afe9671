"""Give NIXL's progress thread a poll delay instead of a busy spin, in every process that creates an agent.

NIXL's Python API hard-codes `pthrDelay = 0` in `nixl_agent_config`, so each agent's UCX progress thread
polls with a zero timeout and burns a whole core, even idle (measured on the 2-core test bed: a two-engine
PD run spent both cores spinning). Our transport installs it with ConnectorConfig.nixl_delay_us; vLLM's own
NixlConnector builds its agent inside vLLM, so our vLLM plugin (connector/plugin.py) installs it in every
process vLLM starts, where NIXL_PTHR_DELAY_US is set.
"""

from __future__ import annotations

import os
from typing import Any

_installed = False


def install(delay_us: int) -> bool:
    """Clamp every NIXL agent config's progress-thread delay to at least `delay_us`."""
    global _installed
    if _installed:
        return True
    delay = delay_us
    if delay <= 0:
        return False
    try:
        import nixl._api as api
    except ImportError:  # NIXL not installed in this environment: nothing to tame
        return False
    base = api.nixlBind.nixlAgentConfig

    class DelayedAgentConfig(base):  # type: ignore[misc, valid-type]  # (a base known only at run time)
        def __setattr__(self, name: str, value: Any) -> None:
            if name == "pthrDelay":
                value = max(int(value), delay)
            super().__setattr__(name, value)

    api.nixlBind.nixlAgentConfig = DelayedAgentConfig
    os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")  # what vLLM would set before creating agents
    _installed = True
    return True
