"""`hybrid_pd.proxy.server.main`: a real process, serving, stopped by SIGTERM with exit code 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request

from hybrid_pd.proxy.server import main


def test_main_serves_and_stops_on_sigterm():
    argv = [sys.executable, "-c", "import sys; from hybrid_pd.proxy.server import main; sys.exit(main(sys.argv[1:]))",
            "--port", "0", "--decode", "http://127.0.0.1:9", "--health-interval", "0", "--log-level", "WARNING"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # blocks until the proxy listens (or the process dies)
        assert line.startswith("hybrid-pd proxy listening on http://127.0.0.1:"), (line, proc.stderr.read())
        url = line.split()[-1]
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert r.status == 200 and json.loads(r.read())["admitted"]["decode"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()


def test_main_refuses_a_broken_config(capsys):
    assert main(["--decode-policy", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--decode" in err and "--decode-policy" in err
    assert main(["--help"]) == 0
