"""Each proxy setting is declared once (proxy/config/declare.py): its flag, its environment name, its default
and its check all come from that declaration, for every setting, not only the ones a test names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hybrid_pd.proxy.config import ProxyConfig
from hybrid_pd.proxy.config.declare import Leaf, boolean, leaves
from hybrid_pd.proxy.config.sources import build_parser, declared, load_config
from hybrid_pd.proxy.errors import ConfigError

D = ["--decode", "http://127.0.0.1:8200"]
LEAVES = leaves(ProxyConfig)
ids = [leaf.setting.name for leaf in LEAVES]


def field_of(config: ProxyConfig, leaf: Leaf) -> Any:
    section = config if leaf.section is None else getattr(config, leaf.section)
    return getattr(section, leaf.field)


def other_value(leaf: Leaf) -> str:
    """A valid value, not the default, as text (as a flag or the environment gives it)."""
    s, default = leaf.setting, leaf.default
    if s.parse is boolean:
        return "false" if default else "true"
    candidates = [s.choices[-1]] if s.choices else []
    if s.parse in (int, float):
        candidates += [str(default + 1), str(default / 2)]
    candidates += ["x-other", "WARNING", "k8s"]
    for text in candidates:
        value = s.parse(text)
        if value != default and (s.check is None or s.check(value) is None):
            return text
    raise AssertionError(f"no other valid value found for {s.name}")


def bad_value(leaf: Leaf) -> str | None:
    """A value the setting's own check refuses, if it has one."""
    s = leaf.setting
    for text in ("-1", "0", "1.5", "70000", "", "chatty", "é"):
        try:
            value = s.parse(text)
        except ValueError:
            continue
        if s.check is not None and s.check(value) is not None:
            return text
    return None


def test_every_flat_name_is_declared_once():
    names = [s.name for s, _, _ in declared()]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("leaf", LEAVES, ids=ids)
def test_the_default_is_the_fields_and_the_help_says_it(leaf):
    assert field_of(load_config(D, env={}), leaf) == leaf.default
    text = " ".join(build_parser().format_help().split())
    assert leaf.setting.flag in text


@pytest.mark.parametrize("leaf", LEAVES, ids=ids)
def test_flag_environment_and_file_reach_the_field(leaf, tmp_path):
    s, text = leaf.setting, other_value(leaf)
    want = s.parse(text)
    base = D + (["--k8s-api-url", "http://127.0.0.1:1"] if s.name == "discovery" else [])  # k8s needs an API
    flag = [f"--no-{s.flag[2:]}"] if s.parse is boolean and not want else [s.flag] if s.parse is boolean else [
        s.flag, text]
    assert field_of(load_config(base + flag, env={}), leaf) == want, s.flag
    assert field_of(load_config(base, env={s.env: text}), leaf) == want, s.env
    f = tmp_path / "proxy.json"
    f.write_text(json.dumps({s.name: text}))
    assert field_of(load_config(base + ["--config", str(f)], env={}), leaf) == want, "file"


@pytest.mark.parametrize("leaf", [leaf for leaf in LEAVES if bad_value(leaf) is not None],
                         ids=[leaf.setting.name for leaf in LEAVES if bad_value(leaf) is not None])
def test_each_check_refuses_naming_its_flag(leaf):
    with pytest.raises(ConfigError) as e:
        load_config(D, env={leaf.setting.env: bad_value(leaf)})
    assert leaf.setting.flag in str(e.value)


def test_every_numeric_setting_has_a_check():
    unchecked = [leaf.setting.name for leaf in LEAVES if leaf.setting.parse in (int, float) and not leaf.setting.check]
    assert not unchecked, f"numbers without a range check: {unchecked}"
