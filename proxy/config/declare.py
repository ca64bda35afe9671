"""One declaration per proxy setting, and what is built from the declarations.

Each setting is declared once, on the dataclass field it fills (`setting(default, name, help, ...)` in
sections.py and in ProxyConfig), or, for the few that fill a composite value (workers, routing policies), in
composite.py. A declaration names the setting's flat name (the JSON file's key; the flag and the environment
name derive from it), its help, how a value from a file, the environment or a flag is parsed, and its own check.
From them: the parser (sources.build_parser), the environment's names (sources.options_from_env), ProxyConfig's
construction from flat options (`flat_fields`) and its per-field checks (`complaints`); ProxyConfig.problems()
adds only the rules that span fields. This module imports nothing of the proxy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "HYBRID_PD_PROXY_"
Check = Callable[[Any], "str | None"]  # a complaint about a value ("must be >= 0"), or None when it is fine


def boolean(value: Any) -> bool:
    """A flag's or the JSON file's bool as is; the environment's text as 1/true/yes/on."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


@dataclass(frozen=True)
class Setting:
    name: str  # flat name: the JSON file's key; `--name-with-dashes`; HYBRID_PD_PROXY_NAME
    help: str
    parse: Callable[[Any], Any] = str  # a value from a file, the environment or a flag -> the field's value
    check: Check | None = None
    choices: tuple[str, ...] | None = None  # refused by the parser itself
    metavar: str | None = None
    many: bool = False  # a repeatable flag; a comma-separated list in the environment

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()


def setting(default: Any, name: str, help: str, **how: Any) -> Any:
    """A dataclass field with its default, declared with everything else about the setting that fills it."""
    return dataclasses.field(default=default, metadata={"setting": Setting(name, help, **how)})


@dataclass(frozen=True)
class Leaf:
    setting: Setting
    section: str | None  # the ProxyConfig field holding it (None: ProxyConfig's own)
    field: str  # its field in that section
    default: Any


def _section_class(f: dataclasses.Field[Any]) -> type | None:
    factory = f.default_factory
    return factory if isinstance(factory, type) and dataclasses.is_dataclass(factory) else None


def leaves(cls: type, section: str | None = None) -> list[Leaf]:
    """Every field-declared setting of `cls` and of its sections, in declaration order."""
    out: list[Leaf] = []
    for f in dataclasses.fields(cls):
        s = f.metadata.get("setting")
        if s is not None:
            out.append(Leaf(s, section, f.name, f.default))
        elif (sub := _section_class(f)) is not None:
            out += leaves(sub, f.name)
    return out


def flat_fields(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments for `cls` from flat options: each given setting parsed, each section built the same
    way; a setting not given (or None) is left out, so its field's default applies."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        s = f.metadata.get("setting")
        if s is not None:
            if options.get(s.name) is not None:
                out[f.name] = s.parse(options[s.name])
        elif (sub := _section_class(f)) is not None:
            out[f.name] = sub(**flat_fields(sub, options))
    return out


def complaints(obj: Any) -> list[str]:
    """The per-field checks of a built config and its sections: '--flag value complaint' each."""
    out: list[str] = []
    for f in dataclasses.fields(obj):
        value, s = getattr(obj, f.name), f.metadata.get("setting")
        if s is not None and s.check is not None and (complaint := s.check(value)):
            out.append(f"{s.flag} {value!r} {complaint}")
        elif s is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += complaints(value)
    return out


def at_least(n: float) -> Check:
    return lambda v: None if v >= n else f"must be >= {n}"


def within(lo: float, hi: float) -> Check:
    return lambda v: None if lo <= v <= hi else f"must be in [{lo:g}, {hi:g}]"


def above(n: float) -> Check:
    return lambda v: None if v > n else f"must be > {n}"


def one_of(*allowed: str, why: str = "") -> Check:
    return lambda v: None if v in allowed else f"is not one of {', '.join(allowed)}{why}"
