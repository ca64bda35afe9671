"""The launcher's shared-core warning finds other worker launchers by their command lines in /proc."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybrid_pd.prefill.launch.cpu_affinity import launcher_binding, parse_cores, sharing


def test_bindings_parse_as_vllm_reads_them():
    assert parse_cores("0") == {0} and parse_cores("0-2,5|7") == {0, 1, 2, 5, 7}
    assert parse_cores("auto") is None and parse_cores(None) is None
    with pytest.raises(ValueError):
        parse_cores("zero")
    assert launcher_binding(["/venv/bin/hybrid-pd", "decode", "--cpu-bind", "1"]) == ("decode", "1")
    assert launcher_binding(["python", "/venv/bin/hybrid-pd", "prefill", "--cpu-bind=0-3"]) == ("prefill", "0-3")
    assert launcher_binding(["/venv/bin/hybrid-pd", "proxy", "--cpu-bind", "1"]) is None  # not a worker
    assert launcher_binding(["/venv/bin/hybrid-pd", "decode"]) == ("decode", None)  # its role's default
    assert launcher_binding(["/venv/bin/hybrid-pd", "decode", "--device", "gpu"]) is None


def test_a_running_launcher_on_an_overlapping_core_is_named():
    # a process whose command line reads like a decode launcher bound to cores 1-2 (argv after -c is kept)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "hybrid-pd", "decode",
                             "--cpu-bind", "1-2"])
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline")
        deadline = time.monotonic() + 10
        while b"hybrid-pd" not in cmdline.read_bytes():  # until the interpreter (a shim may exec it) is running
            assert time.monotonic() < deadline, cmdline.read_bytes()
            time.sleep(0.05)
        assert f"the decode worker pid {proc.pid} (--cpu-bind 1-2)" in sharing({2}, {})
        assert not [s for s in sharing({0}, {}) if f"pid {proc.pid} " in s]
    finally:
        proc.kill()
        proc.wait(10)
