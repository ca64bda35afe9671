"""ConnectorConfig: extra config wins over the environment, defaults otherwise; bad values name their key."""

import pytest

from hybrid_pd.connector.config import ConnectorConfig
from hybrid_pd.connector.errors import ConfigurationError


def test_defaults():
    assert ConnectorConfig.from_sources({}, {}) == ConnectorConfig()


def test_extra_config_wins_over_the_environment():
    env = {"HYBRID_PD_READ_TIMEOUT_S": "5", "HYBRID_PD_LEASE_S": "10", "HYBRID_PD_SHIP_CHECKPOINTS": "no",
           "VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5610",
           "HYBRID_PD_TRANSFER_RESULTS": "legacy", "VLLM_SSM_CONV_STATE_LAYOUT": "DS",
           "HYBRID_PD_NIXL_PROGRESS_THREAD": "0", "HYBRID_PD_IDLE_WAIT_MS": "2"}
    from_env = ConnectorConfig.from_sources({}, env)
    assert from_env == ConnectorConfig("10.0.0.7", 5610, 5.0, 10.0, False, "UCX", True, "DS", False, 2.0)
    both = ConnectorConfig.from_sources({"read_timeout_s": 7, "ship_checkpoints": True,
                                         "nixl_backend": "LIBFABRIC"}, env)
    assert (both.read_timeout_s, both.lease_s, both.ship_checkpoints, both.nixl_backend) == (7.0, 10.0, True,
                                                                                             "LIBFABRIC")


@pytest.mark.parametrize(("extra", "env", "named"), [
    ({"read_timeout_s": "soon"}, {}, "kv_connector_extra_config read_timeout_s='soon'"),
    ({}, {"HYBRID_PD_LEASE_S": "2m"}, "HYBRID_PD_LEASE_S='2m'"),
    ({}, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "x"}, "VLLM_NIXL_SIDE_CHANNEL_PORT='x'"),
    ({"lease_s": 0}, {}, "lease_s=0"),
    ({"nixl_backend": "GDS"}, {}, "nixl_backend='GDS'"),
    ({}, {"HYBRID_PD_IDLE_WAIT_MS": "2ms"}, "HYBRID_PD_IDLE_WAIT_MS='2ms'"),
    ({"idle_wait_ms": 500}, {}, "idle_wait_ms=500"),
    ({}, {"HYBRID_PD_KV_DIGESTS": "all"}, "HYBRID_PD_KV_DIGESTS='all'"),
    ({"kv_digests": 2}, {}, "kv_digests=2.0: must be a fraction 0-1"),
    ({}, {"HYBRID_PD_DIGEST_WAIT_MS": "-1"}, "digest_wait_ms=-1.0: must be 0-100 ms"),
    ({}, {"HYBRID_PD_TEST_CORRUPT_KIND": "zero"}, "HYBRID_PD_TEST_CORRUPT_KIND='zero'"),
    ({}, {"HYBRID_PD_PARAMS_PORT": "inbox"}, "HYBRID_PD_PARAMS_PORT='inbox'"),
    ({"params_port": 70000}, {}, "params_port=70000"),
    ({}, {"HYBRID_PD_AWAIT_TIMEOUT_S": "0"}, "await_timeout_s=0"),
])
def test_a_bad_value_names_its_key(extra, env, named):
    with pytest.raises(ConfigurationError, match=named.replace("(", r"\(")):
        ConnectorConfig.from_sources(extra, env)


def test_kv_digests_from_the_environment_or_the_extra_config():
    assert ConnectorConfig.from_sources({}, {"HYBRID_PD_KV_DIGESTS": "0.25"}).kv_digests == 0.25
    assert ConnectorConfig.from_sources({"kv_digests": 0}, {"HYBRID_PD_KV_DIGESTS": "1"}).kv_digests == 0.0
    assert ConnectorConfig.from_sources({}, {"HYBRID_PD_TEST_CORRUPT_READS": "1"}).test_corrupt_reads == 1
    assert ConnectorConfig.from_sources({}, {}).test_corrupt_kind == "flip"
    zero = ConnectorConfig.from_sources({}, {"HYBRID_PD_TEST_CORRUPT_KIND": "zero-state"})
    assert zero.test_corrupt_kind == "zero-state"


def test_the_params_inbox_and_its_wait_from_the_environment():
    config = ConnectorConfig.from_sources({}, {"HYBRID_PD_PARAMS_PORT": "5620", "HYBRID_PD_AWAIT_TIMEOUT_S": "9"})
    assert (config.params_port, config.await_timeout_s) == (5620, 9.0)
