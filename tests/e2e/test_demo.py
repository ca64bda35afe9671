"""The README's first command, end to end: `hybrid-pd demo --reference` starts the prefill and decode
workers, the proxy and a colocated reference engine, sends its workload through the proxy, and stops them.
PD's greedy output must equal the reference engine's, and the decoder must really have pulled KV over NIXL."""

import json
import subprocess

import psutil
import pytest

from tests.support.procs import HYBRID_PD, free_port

pytestmark = pytest.mark.engines


def free_port_range(n: int) -> int:
    for _ in range(50):
        base = free_port()
        if base + n < 65535 and all(_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no free port range")


def _free(port: int) -> bool:
    from hybrid_pd.prefill.launch.probes import port_is_free

    return port_is_free("127.0.0.1", port)


def test_demo_serves_pd_through_the_proxy_equal_to_one_engine(tmp_path):
    report_path = tmp_path / "report.json"
    base = free_port_range(25)
    run = subprocess.run([HYBRID_PD, "demo", "--reference", "--base-port", str(base),
                          "--logs", str(tmp_path / "logs"), "--report", str(report_path)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert [r["matches_reference"] for r in report["requests"]] == [True] * len(report["requests"])
    assert report["transfer"]["bytes"] > 0 and report["transfer"]["failed_transfers"] == 0
    assert all(r["completion_tokens"] == 16 for r in report["requests"])
    assert "moved P->D over NIXL" in run.stdout and "[demo] stopped all processes" in run.stdout
    ports = {str(base + k) for k in range(4)}  # proxy, prefill, decode, reference
    leftovers = [p.pid for p in psutil.process_iter(["cmdline"]) if ports & set(p.info["cmdline"] or [])]
    assert leftovers == []
