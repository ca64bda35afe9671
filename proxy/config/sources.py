"""Where the proxy's options come from: a JSON file (`--config`), the environment, the command line.

Later sources win: file < environment (`HYBRID_PD_PROXY_<NAME>`, e.g. HYBRID_PD_PROXY_MAX_QUEUE=64; list options
take a comma-separated value) < flags. Every source uses the same flat names (a flag's name with `_`), so a
JSON file reads like {"decode": ["http://10.0.0.2:8200"], "decode_policy": "kv_hit=2,least_loaded"}.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..errors import ConfigError
from . import ProxyConfig
from .composite import CONFIG_FILE, POLICIES, WORKERS
from .declare import ENV_PREFIX, Setting, boolean, leaves

# --help headings, by the ProxyConfig field whose section a setting fills
GROUPS = {
    "k8s": "Kubernetes discovery",
    "routing": "routing",
    "kv": "KV index",
    "disagg": "conditional disaggregation",
    "timeouts": "timeouts (seconds)",
    "admission": "admission",
    "health": "health and load",
    "drain": "shutdown (SIGTERM; a second SIGTERM or SIGINT stops at once)",
}


def declared() -> list[tuple[Setting, str | None, Any]]:
    """Every setting with its --help heading and its default (None: none shown), in --help order."""
    fields = [(leaf.setting, leaf.section, leaf.default) for leaf in leaves(ProxyConfig)]
    return [
        (CONFIG_FILE.setting, None, None),
        *[(c.setting, "workers", None) for c in WORKERS],
        *[(c.setting, "routing", None) for c in POLICIES],
        *fields,
    ]


def _help(s: Setting, default: Any) -> str:
    if default is None or default == "" or "default" in s.help.lower():
        return s.help
    shown = ("on" if default else "off") if isinstance(default, bool) else default
    return f"{s.help} (default: {shown})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hybrid-pd proxy",
        description="OpenAI-compatible PD routing proxy "
        "for hybrid Mamba/attention models (decode-first, cache- and hybrid-aware).",
        argument_default=argparse.SUPPRESS,
    )
    groups: dict[str, Any] = {}
    for s, section, default in declared():
        heading = GROUPS.get(section or "", section)
        target = p if heading is None else groups.setdefault(heading, p.add_argument_group(heading))
        how: dict[str, Any] = {"help": _help(s, default)}
        if s.many:
            how["action"] = "append"
        elif s.parse is boolean:
            how["action"] = argparse.BooleanOptionalAction
        elif s.parse in (int, float):
            how["type"] = s.parse
        if s.choices:
            how["choices"] = s.choices
        if s.metavar:
            how["metavar"] = s.metavar
        target.add_argument(s.flag, **how)
    return p


def options_from_env(env: dict[str, str]) -> dict[str, Any]:
    """HYBRID_PD_PROXY_<NAME> values by flat name, as text (each setting parses its own), lists split at commas."""
    many = {s.name for s, _, _ in declared() if s.many}
    out: dict[str, Any] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        out[name] = [v.strip() for v in value.split(",") if v.strip()] if name in many else value
    return out


def options_from_file(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError([f"--config {path}: cannot read a JSON object ({e})"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"--config {path}: the file must hold a JSON object of options"])
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_config(argv: list[str], env: dict[str, str] | None = None) -> ProxyConfig:
    """CLI argv (without the program name) + environment + optional JSON file -> one validated config."""
    flags = vars(build_parser().parse_args(argv))
    env_opts = options_from_env(dict(os.environ) if env is None else env)
    path = flags.pop("config", None) or env_opts.pop("config", None)
    merged: dict[str, Any] = options_from_file(path) if path else {}
    merged.update(env_opts)
    merged.update(flags)
    try:
        return ProxyConfig.from_flat(merged)
    except (TypeError, ValueError) as e:  # a value of the wrong type in the file or environment
        raise ConfigError([f"option value of the wrong type: {e}"]) from None
