"""One frozen config from file < environment < flags; broken combinations refused, naming the flag."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybrid_pd.proxy.config import ProxyConfig, WorkerSpec, parse_policy
from hybrid_pd.proxy.config.sources import load_config
from hybrid_pd.proxy.errors import ConfigError

D = ["--decode", "http://127.0.0.1:8200"]


def test_flags_build_a_frozen_config():
    c = load_config(["--port", "0", "--prefill", "http://p:1/", "--prefill", "http://p:2", "--decode", "http://d:1",
                     "--prefill-events", "tcp://p:5", "--prefill-events", "tcp://p:6", "--decode-policy",
                     "kv_hit=2,least_loaded", "--prefill-timeout", "3", "--no-disagg", "--max-queue", "5"], env={})
    assert c.prefill == (WorkerSpec("http://p:1", "tcp://p:5"), WorkerSpec("http://p:2", "tcp://p:6"))
    assert c.routing.decode.scorers == (("kv_hit", 2.0), ("least_loaded", 1.0))
    assert c.timeouts.prefill_s == 3.0 and c.disagg.enabled is False and c.admission.max_queue == 5
    assert c.tokenize  # kv_hit needs token ids
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.port = 1  # type: ignore[misc]


def test_file_then_env_then_flags(tmp_path):
    f = tmp_path / "proxy.json"
    f.write_text(json.dumps({"decode": ["http://file:1"], "max_queue": 7, "max_in_flight": 3, "port": 9}))
    env = {"HYBRID_PD_PROXY_MAX_QUEUE": "8", "HYBRID_PD_PROXY_PREFILL": "http://e1:1,http://e2:1",
           "HYBRID_PD_PROXY_DISAGG": "false", "OTHER": "x"}
    c = load_config(["--config", str(f), "--port", "10"], env=env)
    assert c.decode == (WorkerSpec("http://file:1"),) and c.admission.max_in_flight == 3
    assert c.admission.max_queue == 8 and c.port == 10 and not c.disagg.enabled
    assert [w.url for w in c.prefill] == ["http://e1:1", "http://e2:1"]


@pytest.mark.parametrize("argv, flag", [
    ([], "--decode"),
    (D + ["--decode-policy", "magic"], "--decode-policy"),
    (D + ["--prefill-picker", "nope"], "--prefill-picker"),
    (D + ["--decode-policy", "kv_hit=-1"], "--decode-policy"),
    (D + ["--kv-hash-algo", "sha256", "--kv-hash-block-size", "-4"], "--kv-hash-block-size"),
    (D + ["--decoder-hit-ratio", "1.5"], "--decoder-hit-ratio"),
    (D + ["--shared-device", "--shared-device-stall", "1.5"], "--shared-device-stall"),
    (D + ["--prefill-timeout", "0"], "--prefill-timeout"),
    (D + ["--decode-events", "tcp://a:1", "--decode-events", "tcp://b:1"], "--decode-events"),
    (["--decode", "ftp://x"], "--decode"),
    (D + ["--max-in-flight", "0"], "--max-in-flight"),
    (D + ["--log-level", "chatty"], "--log-level"),
])
def test_refusals_name_the_flag(argv, flag):
    with pytest.raises(ConfigError) as e:
        load_config(argv, env={})
    assert flag in str(e.value)


def test_k8s_outside_a_pod_needs_an_api_url(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ConfigError, match="--k8s-api-url"):
        load_config(["--discovery", "k8s"], env={})
    c = load_config(["--discovery", "k8s", "--k8s-api-url", "http://127.0.0.1:1"], env={})
    assert c.decode == () and c.k8s.api_url == "http://127.0.0.1:1"


def test_bad_file_and_bad_types(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("[1]")
    with pytest.raises(ConfigError, match="--config"):
        load_config(["--config", str(f)], env={})
    with pytest.raises(ConfigError, match="wrong type"):
        load_config(D, env={"HYBRID_PD_PROXY_MAX_QUEUE": "lots"})


def test_parse_policy_forms():
    assert parse_policy("none") == () == parse_policy("")
    assert parse_policy(["a=2", "b"]) == (("a", 2.0), ("b", 1.0)) == parse_policy({"a": 2, "b": 1})
    with pytest.raises(ConfigError):
        parse_policy("a=x")


def test_defaults_are_valid():
    c = ProxyConfig(decode=(WorkerSpec("http://d:1"),))
    assert c.routing.decode.picker == "round_robin" and not c.tokenize


def test_default_policy_uses_kv_events_when_there_are_some():
    plain = load_config(D, env={})
    assert plain.routing.decode.scorers == (("least_loaded", 1.0),) and not plain.tokenize
    with_events = load_config(D + ["--decode-events", "tcp://127.0.0.1:5"], env={})
    assert with_events.routing.decode.scorers == with_events.routing.prefill.scorers == (
        ("kv_hit", 2.0), ("least_loaded", 1.0))
    explicit = load_config(D + ["--decode-events", "tcp://127.0.0.1:5", "--decode-policy", "none"], env={})
    assert explicit.routing.decode.scorers == () and explicit.routing.prefill.uses("kv_hit")
