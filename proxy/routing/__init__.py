"""Routing policies as plugins: scorers in [0, 1] and pickers, registered by name, composed by config.

Built in: scorers `least_loaded`, `session_affinity`, `kv_hit`, `queue_cost` (tokens to compute before this
request's first token: the queue ahead plus its own uncached part); pickers `round_robin` (rotates among the
best-scored workers; with no scorers it is plain round robin) and `first` (the first best, deterministic).
"""

from . import first, kv_hit, least_loaded, queue_cost, round_robin, session_affinity  # noqa: F401  (registers them)
from .base import Deps, RequestContext
from .registry import PICKERS, SCORERS, register_picker, register_scorer
from .router import Router

__all__ = ["Deps", "PICKERS", "RequestContext", "Router", "SCORERS", "register_picker", "register_scorer"]
