"""hybrid-pd KV connector for vLLM (see ARCHITECTURE.md). Importing this package must stay light: no vLLM.

vLLM loads `HybridPDConnector` from here (`kv_connector_module_path: hybrid_pd.connector`); the class lives in
`vllm_glue`, imported on first attribute access so the pure modules (plan, messages, transport) and their
tests never import vLLM.
"""

from __future__ import annotations

__all__ = ["HybridPDConnector"]


def __getattr__(name: str) -> object:
    if name == "HybridPDConnector":
        from hybrid_pd.connector.vllm_glue import HybridPDConnector

        return HybridPDConnector
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
