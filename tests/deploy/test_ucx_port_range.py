"""The worker NetworkPolicy admits UCX's TCP lanes only on the ConfigMap's UCX_TCP_PORT_RANGE: checked on real
NIXL agents (UCX backend, TCP only) that every port UCX listens on is in that range, and that without the
setting it listens on ephemeral ports the policy would block (the negative control)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.support.k8s_policy import K8S

AGENTS = """
import json
import psutil
from nixl._api import nixl_agent, nixl_agent_config
agents = [nixl_agent(n, nixl_agent_config(backends=["UCX"])) for n in ("a", "b")]
print(json.dumps(sorted({c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == "LISTEN"})))
"""


def listening_ports(port_range: str | None) -> list[int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UCX_")}
    env["UCX_TLS"] = "tcp"
    if port_range:
        env["UCX_TCP_PORT_RANGE"] = port_range
    out = subprocess.run([sys.executable, "-c", AGENTS], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def configured() -> tuple[int, int]:
    config = yaml.safe_load((K8S / "base" / "configmap.yaml").read_text())["data"]
    low, high = config["UCX_TCP_PORT_RANGE"].split("-")
    return int(low), int(high)


def test_ucx_listens_only_in_the_configured_range(configured):
    low, high = configured
    ports = listening_ports(f"{low}-{high}")
    assert ports and all(low <= p <= high for p in ports), ports


def test_without_the_range_ucx_listens_where_the_policy_would_block_it(configured):
    low, high = configured
    ports = listening_ports(None)
    assert ports and any(not low <= p <= high for p in ports), ports
