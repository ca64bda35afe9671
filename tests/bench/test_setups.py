"""The one harness of the CPU and GPU benchmarks (benchmarks/setups.py): the launcher commands each machine
gives its workers, the command-line flags of the GPU settings, and the toy flow's two legs against fake
workers on 127.0.0.1 (no engines)."""

from __future__ import annotations

import argparse
import http.server
import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks.client import scrape
from benchmarks.procs import free_port
from benchmarks.setups import CpuBed, Gpus, Setup, launcher_argv, proxy_argv


def after(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_cpu_bed_places_roles_on_cores_and_splits_extra_flags(tmp_path):
    bed = CpuBed("/m", extra=("--checkpoint-every", "256", "--", "--enforce-eager"))
    p = launcher_argv(bed, "prefill", "hybrid", 9000, tmp_path / "p.ready")
    d = launcher_argv(bed, "decode", "none", 9001, tmp_path / "d.ready")
    assert (p[1], after(p, "--cpu-bind"), after(d, "--cpu-bind")) == ("prefill", "0", "1")
    assert (after(p, "--connector"), after(d, "--connector"), after(p, "--port")) == ("hybrid", "none", "9000")
    assert after(p, "--checkpoint-every") == "256" and p.index("--checkpoint-every") < p.index("--")
    assert p[p.index("--") + 1:] == ["--enforce-eager"]
    assert after(p, "--ready-file") == str(tmp_path / "p.ready") and after(p, "--served-model-name") == "tiny"
    assert (after(p, "--kv-cache-gib"), after(p, "--max-model-len"), after(p, "--warmup-lengths")) == (
        "1", "2048", "none")
    assert "--" not in launcher_argv(CpuBed("/m"), "decode", "none", 9002, tmp_path / "r")
    assert bed.worker_env("prefill") == {} and not bed.one_at_a_time


def test_gpus_flags_graphs_and_placement(tmp_path):
    gpus = Gpus("/m", max_num_seqs=8, prefill_gpu=0, decode_gpu=1, checkpoint_every=544,
                vllm_extra=("--profiler-config", "{}"))
    argv = launcher_argv(gpus, "prefill", "upstream", 9000, tmp_path / "r")
    assert (after(argv, "--device"), after(argv, "--gpu-memory-utilization"), after(argv, "--max-num-seqs")) == (
        "gpu", "0.28", "8")
    assert after(argv, "--checkpoint-every") == "544" and after(argv, "--served-model-name") == "m"
    vllm = argv[argv.index("--") + 1:]
    assert json.loads(after(vllm, "--additional-config")) == {"gdn_prefill_backend": "triton"}
    assert json.loads(after(vllm, "--compilation-config"))["cudagraph_capture_sizes"] == [1, 2, 4, 8]
    assert vllm[-2:] == ["--profiler-config", "{}"]
    assert gpus.worker_env("prefill")["CUDA_VISIBLE_DEVICES"] == "0"
    assert gpus.worker_env("decode")["CUDA_VISIBLE_DEVICES"] == "1" and not gpus.one_at_a_time
    assert Gpus("/m").one_at_a_time  # P and D share GPU 0: started one after the other
    eager = launcher_argv(Gpus("/m", graphs="none"), "decode", "none", 1, tmp_path / "r")
    assert "--enforce-eager" in eager and "--compilation-config" not in eager
    assert "--checkpoint-every" not in eager


def test_gpu_settings_are_flags_with_the_dataclass_defaults():
    ap = argparse.ArgumentParser()
    Gpus.add_flags(ap)
    args = ap.parse_args(["--model", "/m", "--util", "0.8", "--decode-gpu", "1", "--v2"])
    gpus = Gpus.from_args(args, {"HYBRID_PD_SHIP_CHECKPOINTS": "0"})
    assert (gpus.util, gpus.decode_gpu, gpus.max_num_seqs, gpus.graphs) == (0.8, 1, Gpus.max_num_seqs, "decode")
    assert gpus.env == {"VLLM_USE_V2_MODEL_RUNNER": "1", "HYBRID_PD_SHIP_CHECKPOINTS": "0"}
    with pytest.raises(SystemExit):
        ap.parse_args(["--model", "/m", "--graphs", "piecewise"])


def test_unknown_setup_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="unknown set-up"):
        Setup("hybrid-pd-1p2d", CpuBed("/m"), tmp_path)


class FakeWorker(http.server.ThreadingHTTPServer):
    """P answers one JSON completion with kv_transfer_params and its own prefix hit; D streams two tokens with
    logprobs and reports a hit of its own; both remember the bodies they got."""

    def __init__(self, role: str):
        self.role, self.bodies = role, []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                if outer.role == "p":
                    data = json.dumps({"choices": [{"text": "x"}], "kv_transfer_params": {"remote_block_ids": [7]},
                                       "usage": {"prompt_tokens_details": {"cached_tokens": 256}}}).encode()
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in ({"choices": [{"text": "a", "logprobs": {"tokens": ["a"],
                                                                      "top_logprobs": [{"a": -0.1, "b": -1.1}]}}]},
                              {"choices": [{"text": "b",
                                            "logprobs": {"tokens": ["b"], "top_logprobs": [{"b": -0.2}]}}]},
                              {"choices": [], "usage": {"completion_tokens": 2,
                                                        "prompt_tokens_details": {"cached_tokens": 512}}}):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")

            def do_GET(self):  # /metrics
                data = b'vllm:prefix_cache_hits_total{engine="0"} 3\nvllm:kv_cache_usage_perc 0.5\n'
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def test_toy_flow_sends_p_then_d_and_reports_p_hit(tmp_path: Path):
    p, d = FakeWorker("p"), FakeWorker("d")
    try:
        setup = Setup("upstream", CpuBed("/m"), tmp_path)
        setup.prefillers, setup.decoder, setup.flow = [SimpleNamespace(url=p.url)], SimpleNamespace(url=d.url), "toy"
        seen = setup.send({"model": "m", "prompt": [1, 2, 3], "max_tokens": 2, "logprobs": 2})
        assert p.bodies[0]["max_tokens"] == 1 and p.bodies[0]["stream"] is False and "logprobs" not in p.bodies[0]
        assert p.bodies[0]["kv_transfer_params"]["do_remote_decode"] is True
        assert d.bodies[0]["kv_transfer_params"] == {"remote_block_ids": [7]} and d.bodies[0]["logprobs"] == 2
        assert (seen["hit_tokens"], seen["reported_cached"], seen["text"]) == (256, 512, "ab")
        assert seen["tokens"] == ["a", "b"] and seen["margins"][0] == pytest.approx(1.0)
        assert seen["p_s"] is not None and seen["arrivals"][0] >= seen["p_s"]
        assert scrape(d.url) == {'vllm:prefix_cache_hits_total{engine="0"}': 3.0}  # counters only
    finally:
        p.shutdown()
        d.shutdown()


def test_our_proxy_is_told_that_vllm_splits_at_the_boundary_before_0_32():
    from benchmarks.setups import vllm_splits_at_boundary

    assert vllm_splits_at_boundary("0.26.0") and vllm_splits_at_boundary("0.31.2")
    assert not vllm_splits_at_boundary("0.32.0") and not vllm_splits_at_boundary("0.33.0+cu130")
    assert not vllm_splits_at_boundary("1.0.0") and not vllm_splits_at_boundary("dev")


def test_our_proxy_is_told_of_a_shared_gpu_only_where_p_and_d_share_one():
    workers = [SimpleNamespace(url=f"http://127.0.0.1:{9000 + i}", argv=["--kv-events-port", str(7000 + i)])
               for i in range(2)]
    def argv(machine):
        return proxy_argv(machine, 8000, workers[:1], workers[1], ("--pd-policy", "ours"))
    assert "--shared-device" in argv(Gpus("/m", prefill_gpu=0, decode_gpu=0))
    assert "--shared-device" not in argv(Gpus("/m", prefill_gpu=0, decode_gpu=1))
    assert "--shared-device" not in argv(CpuBed("/m"))  # P and D on cores of their own
    assert argv(Gpus("/m"))[-6:] == ["--prefill", workers[0].url, "--prefill-events", "tcp://127.0.0.1:7000",
                                     "--decode-events", "tcp://127.0.0.1:7001"]


def test_a_decoder_of_ours_gets_a_params_inbox_that_our_proxy_is_told_of(tmp_path: Path):
    """So that a proxy variant with --early-decode (judged.sh's --proxy-variants) has an inbox to deliver to."""
    d = launcher_argv(CpuBed("/m"), "decode", "hybrid", 9001, tmp_path / "d.ready")
    assert "--params-port" not in launcher_argv(CpuBed("/m"), "decode", "upstream", 9002, tmp_path / "u.ready")
    assert "--params-port" not in launcher_argv(CpuBed("/m"), "prefill", "hybrid", 9003, tmp_path / "p.ready")
    decoder = SimpleNamespace(url="http://127.0.0.1:9001", argv=d)
    prefiller = SimpleNamespace(url="http://127.0.0.1:9000", argv=["--kv-events-port", "7000"])
    argv = proxy_argv(CpuBed("/m"), 8000, [prefiller], decoder, ("--early-decode",))
    port = d[d.index("--params-port") + 1]
    assert argv[argv.index("--decode-inbox") + 1] == f"tcp://127.0.0.1:{port}" and "--early-decode" in argv


def test_restart_proxy_stops_the_last_and_starts_one_with_the_variants_flags(tmp_path: Path):
    """Real proxies (`hybrid-pd proxy`) in front of fake workers: the variant's proxy runs with the set-up's flags
    and the variant's, under a log of its own, and the one before is stopped; the same engines stay."""
    p, d = FakeWorker("p"), FakeWorker("d")
    setup = Setup("hybrid-pd-1p1d", CpuBed("/m"), tmp_path, proxy_args=("--tokenizer", "remote"))
    try:
        workers = [SimpleNamespace(url=w.url, argv=["--kv-events-port", str(free_port())]) for w in (p, d)]
        setup.prefillers, setup.decoder, setup.flow = workers[:1], workers[1], "proxy"
        first = setup.front = setup.workers.proxy(setup.prefillers, setup.decoder, setup.proxy_args)
        setup.restart_proxy(("--pd-policy", "isl-bounding", "--no-shared-device"), "proxy-isl-bounding")
        assert first.proc.poll() is not None and setup.front is not first and setup.workers.procs == [setup.front]
        assert "--tokenizer remote --pd-policy isl-bounding --no-shared-device" in " ".join(setup.front.argv)
        assert setup.front.log_path.name == "hybrid-pd-1p1d-proxy-isl-bounding.log"
        assert (tmp_path / "hybrid-pd-1p1d-proxy.log").exists()  # the first proxy's log stays
        seen = setup.send({"model": "m", "prompt": [1, 2, 3], "max_tokens": 2, "logprobs": 2})
        assert seen["text"] == "ab" and d.bodies  # served through the variant's proxy
        with pytest.raises(SystemExit, match="no proxy of ours"):
            Setup("colocated", CpuBed("/m"), tmp_path).restart_proxy((), "proxy-x")
    finally:
        setup.close()
        p.shutdown()
        d.shutdown()
