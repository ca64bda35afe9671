"""Routing plugins by name. A plugin module registers itself with a decorator; config names them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .base import Deps, Picker, Scorer

SCORERS: dict[str, Callable[[Deps], Scorer]] = {}
PICKERS: dict[str, Callable[[Deps], Picker]] = {}


def register_scorer(name: str) -> Callable[[Any], Any]:
    def add(factory: Any) -> Any:
        if name in SCORERS:
            raise ValueError(f"scorer {name!r} registered twice")
        SCORERS[name] = factory
        return factory

    return add


def register_picker(name: str) -> Callable[[Any], Any]:
    def add(factory: Any) -> Any:
        if name in PICKERS:
            raise ValueError(f"picker {name!r} registered twice")
        PICKERS[name] = factory
        return factory

    return add
