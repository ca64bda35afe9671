"""The NIXL backend setting: kv_connector_extra_config `nixl_backend` wins over HYBRID_PD_NIXL_BACKEND, UCX by
default, anything else refused naming where it came from; the choice reaches NIXL's agent config."""

import sys
import types

import pytest

from hybrid_pd.connector import nixl_delay
from hybrid_pd.connector.errors import ConfigurationError
from hybrid_pd.connector.transport import NixlTransport, nixl_backend


@pytest.mark.parametrize("extra, env, want", [
    ({}, {}, "UCX"),
    ({}, {"HYBRID_PD_NIXL_BACKEND": "LIBFABRIC"}, "LIBFABRIC"),
    ({"nixl_backend": "UCX"}, {"HYBRID_PD_NIXL_BACKEND": "LIBFABRIC"}, "UCX"),
    ({"nixl_backend": "LIBFABRIC"}, {}, "LIBFABRIC"),
])
def test_extra_config_wins_over_the_environment_and_ucx_is_the_default(extra, env, want):
    assert nixl_backend(extra, env) == want


@pytest.mark.parametrize("extra, env, named", [
    ({"nixl_backend": "efa"}, {}, "kv_connector_extra_config nixl_backend='efa'"),
    ({"nixl_backend": "ucx"}, {}, "kv_connector_extra_config nixl_backend='ucx'"),
    ({}, {"HYBRID_PD_NIXL_BACKEND": "GDS"}, "HYBRID_PD_NIXL_BACKEND='GDS'"),
])
def test_an_unknown_backend_is_refused_naming_the_setting(extra, env, named):
    with pytest.raises(ConfigurationError) as e:
        nixl_backend(extra, env)
    assert named in str(e.value) and "UCX, LIBFABRIC" in str(e.value)


def test_the_chosen_backend_reaches_the_nixl_agent_config(monkeypatch):
    seen = []
    fake = types.ModuleType("nixl._api")
    fake.nixl_agent_config = lambda backends, enable_prog_thread: seen.append((backends, enable_prog_thread)) or 1
    fake.nixl_agent = lambda name, config: types.SimpleNamespace(name=name)
    monkeypatch.setitem(sys.modules, "nixl._api", fake)
    monkeypatch.setattr(nixl_delay, "install", lambda delay_us: False)
    NixlTransport("efa-test", backend="LIBFABRIC", delay_us=1000)
    # the CPU launchers' setting (HYBRID_PD_NIXL_PROGRESS_THREAD=0)
    NixlTransport("cpu-test", progress_thread=False, delay_us=1000)
    assert seen == [(["LIBFABRIC"], True), (["UCX"], False)]
