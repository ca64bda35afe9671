"""The launcher around a real vLLM process: a child that dies at start-up makes the launcher exit non-zero
with the child's last log lines, and leaves no process behind."""

import subprocess

import psutil

from tests.support.procs import HYBRID_PD, free_port


def test_vllm_dying_at_startup_exits_nonzero_with_its_last_lines(tiny_model):
    before = {p.pid for p in psutil.process_iter()}
    run = subprocess.run(
        [HYBRID_PD, "decode", "--model", tiny_model, "--connector", "none", "--port", str(free_port()),
         "--kv-events-port", str(free_port()), "--startup-timeout", "300", "--", "--no-such-vllm-flag"],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "decode worker exited with code" in run.stderr
    assert "last lines of the vLLM log" in run.stderr and "--no-such-vllm-flag" in run.stderr
    leftovers = [p for p in psutil.process_iter(["cmdline"])
                 if p.pid not in before and "--no-such-vllm-flag" in " ".join(p.info["cmdline"] or [])]
    assert leftovers == []


def test_broken_configuration_is_refused_before_vllm_starts(tiny_model):
    run = subprocess.run([HYBRID_PD, "prefill", "--model", tiny_model, "--conv-state-layout", "SD"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "use --conv-state-layout DS" in run.stderr and "vllm" not in run.stdout.lower()
