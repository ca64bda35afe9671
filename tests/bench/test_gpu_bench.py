"""The GPU benchmark's CPU-side logic (benchmarks/gpu/): workload sizing, metric deltas, the merge into
results.json ratios, and the real-shape configs. The GPU parts run only on the device machine."""

from __future__ import annotations

import importlib
import json

import pytest


def load(name: str):
    return importlib.import_module(f"benchmarks.{name}")


@pytest.fixture(scope="module")
def bench():
    return load("gpu.bench")


@pytest.fixture(scope="module")
def tokens(tiny_model):
    from benchmarks.workloads import Tokens

    return Tokens(tiny_model)


@pytest.mark.parametrize("length", [2048, 8192])
def test_workloads_average_the_asked_length(bench, tokens, length):
    for kind in ("agentic", "shared_system", "insert_middle"):
        reqs = bench.workload(kind, tokens, length, 1, seed=7)
        mean = sum(len(r.token_ids) for r in reqs) / len(reqs)
        assert 0.8 * length < mean < 1.2 * length, (kind, mean)
    assert len(bench.sessions_of(bench.workload("agentic", tokens, length, 8, seed=7))) == 8


def test_metric_deltas_keep_proxy_labels_and_sum_engine_labels():
    before = {"decode": {'vllm:request_queue_time_seconds_sum{engine="0",model_name="m"}': 1.0},
              "front": {'hybrid_pd_proxy_stage_latency_seconds_sum{stage="prefill"}': 2.0}}
    after = {"decode": {'vllm:request_queue_time_seconds_sum{engine="0",model_name="m"}': 1.5,
                        'vllm:prompt_tokens_total{engine="0",model_name="m"}': 100.0},
             "front": {'hybrid_pd_proxy_stage_latency_seconds_sum{stage="prefill"}': 2.25}}
    d = load("client").metric_deltas(before, after)
    assert d["decode"] == {"vllm:request_queue_time_seconds_sum": 0.5, "vllm:prompt_tokens_total": 100.0}
    assert d["front"] == {'hybrid_pd_proxy_stage_latency_seconds_sum{stage="prefill"}': 0.25}


def row(session, turn, ttft, text, prompt=9000, conc=1, **kw):
    return dict(workload="agentic", length=8192, concurrency=conc, session=session, turn=turn, prompt_tokens=prompt,
                hit_tokens=kw.get("hit", 0), oracle_hit=kw.get("hit", 0), ttft_s=ttft, itl_s=0.008, text=text,
                **{k: v for k, v in kw.items() if k != "hit"})


def part(setup, rows_c1, rows_c8, tok_s, copy=()):
    runs = [{"workload": "agentic", "length": 8192, "concurrency": c, "rows": rows, "wall_s": 1.0, "errors": [],
             "throughput_tok_s": t, "transfer": {"bytes": 0.0, "descriptors": 0.0, "transfers": 0.0,
                                                 "transfer_seconds": 0.0, "failed_transfers": 0.0}}
            for c, rows, t in ((1, rows_c1, tok_s[0]), (8, rows_c8, tok_s[1]))]
    return {"setup": setup, "tag": "", "args": {}, "runs": runs, "probe": [], "errors": [],
            "device_copy": list(copy), "start_s": {}, "block": 544}


def test_merge_ratios(tmp_path):
    merge = load("gpu.merge")
    col = part("colocated", [row("a", 0, 0.10, "x"), row("a", 1, 0.20, "y", hit=544)], [row("a", 0, 0.3, "z", conc=8)],
               (100, 800))
    up = part("upstream", [row("a", 0, 0.30, "x"), row("a", 1, 0.40, "q", hit=544)], [row("a", 0, 1.0, "z", conc=8)],
              (90, 400))
    ours = part("hybrid-pd-1p1d",
                [row("a", 0, 0.15, "x", bytes=4e7, descriptors=45, transfer_seconds=0.1),
                 row("a", 1, 0.10, "y", hit=544, bytes=0, descriptors=0, transfer_seconds=0)],
                [row("a", 0, 0.9, "w", conc=8)], (95, 600),
                copy=[{"bytes": 40000000, "descriptors": 45, "contiguous_gb_s": 1000.0, "pieces_gb_s": 500.0,
                       "contiguous_s": 4e-5, "pieces_s": 8e-5}])
    for p in (col, up, ours):
        (tmp_path / f"part-{p['setup']}.json").write_text(json.dumps(p))
    r = merge.merge(tmp_path, 8192)["ratios"]
    assert r["ttft_p50_vs_upstream_c1"] == pytest.approx(0.15 / 0.40)  # p50 of two values: the upper one
    assert r["ttft_p50_vs_colocated_c1"] == pytest.approx(0.15 / 0.20)
    assert r["throughput_vs_upstream"] == pytest.approx(600 / 400)
    assert r["dlocal_ttft_vs_colocated"] == pytest.approx(0.10 / 0.20)  # turn 1 moved no bytes and hit
    assert r["transfer_vs_device_copy"] == pytest.approx((4e7 / 0.1) / 1e12)
    assert r["equal_to_colocated"] == pytest.approx(2 / 3)
    assert r["equal_to_upstream_c1"] == pytest.approx(1 / 2)
    assert "generated tables" in merge.summary_md(merge.merge(tmp_path, 8192), "t")


def test_merge_two_gpus(tmp_path):
    """P on a GPU of its own: the transfer is compared with a copy between the GPUs, ITL percentiles pool every
    token gap, and the decoder's no-prefill-load ITL is the basis of `itl_p50_vs_decode_alone`."""
    merge = load("gpu.merge")
    gaps = lambda ms: {"gaps_ms": ms}  # noqa: E731
    col = part("colocated", [row("a", 0, 0.10, "x")], [row("a", 0, 0.3, "z", conc=8) | gaps([20.0, 30.0, 40.0])],
               (100, 800))
    ours = part("hybrid-pd-1p1d", [row("a", 0, 0.15, "x", bytes=4e7, descriptors=45, transfer_seconds=0.1)],
                [row("a", 0, 0.9, "w", conc=8) | gaps([10.0, 11.0, 90.0]),
                 row("b", 0, 0.9, "v", conc=8) | gaps([12.0])],
                (95, 600),
                copy=[{"bytes": 40000000, "descriptors": 45, "contiguous_gb_s": 1000.0, "pieces_gb_s": 500.0,
                       "contiguous_s": 4e-5, "pieces_s": 8e-5, "peer_gb_s": 400.0, "peer_s": 1e-4}])
    ours["decode_alone"] = [{"concurrency": 8, "length": 8192, "gaps": 100, "window_s": 1.0, "itl_p50_ms": 10.0,
                             "itl_p99_ms": 15.0}]
    for p in (col, ours):
        (tmp_path / f"part-{p['setup']}.json").write_text(json.dumps(p))
    res = merge.merge(tmp_path, 8192)
    r = res["ratios"]
    assert r["transfer_vs_device_copy"] == pytest.approx((4e7 / 0.1) / 400e9)
    assert r["itl_p50_vs_colocated"] == pytest.approx(12.0 / 30.0)  # pooled gaps 10, 11, 12, 90: p50 is 12
    assert r["itl_p50_vs_decode_alone"] == pytest.approx(12.0 / 10.0)
    table = {t["setup"]: t for t in res["tables"] if t["concurrency"] == 8}
    assert table["hybrid-pd-1p1d"]["itl_p99_ms"] == 90.0
    text = merge.summary_md(res, "t")
    assert "no prefill load" in text and "| 400 |" in text


def test_decode_alone_window():
    """Gaps count only while every stream decodes: after the last first token, before the first stream ends."""
    early = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]  # decodes alone at first (gaps of 100 ms)
    late = [0.35, 0.37, 0.39, 0.41, 0.43, 0.45, 0.47, 0.6]
    got = load("gpu.probes").all_decoding([early, late])
    assert got["window_s"] == pytest.approx(0.5 - 0.35)
    assert got["gaps"] == 6 + 1  # late's 0.35..0.47 (6 gaps) and early's 0.4 -> 0.5
    assert got["itl_p50_ms"] == pytest.approx(20.0)
    assert got["itl_p99_ms"] == pytest.approx(100.0)


def test_real_shapes_state_bytes():
    shapes = load("gpu.real_shapes")
    q = shapes.state_bytes_per_token(shapes.qwen3next_config())
    assert (q["attention_layers"], q["state_layers"], q["kv_bytes_per_token_per_layer"]) == (3, 9, 2048)
    assert q["state_bytes_per_layer"] == (32 * 128 * 128 + 3 * (2 * 16 * 128 + 32 * 128)) * 2
    n = shapes.state_bytes_per_token(shapes.nemotronh_config())
    assert (n["attention_layers"], n["state_layers"], n["kv_bytes_per_token_per_layer"]) == (2, 9, 4096)


def test_greedy_consistency_up_to_near_ties():
    merge = load("gpu.merge")
    ref = {"tokens": ["a", "b", "c"], "margins": [2.0, 0.02, 1.0]}
    assert merge.consistent({"tokens": ["a", "b", "c"], "margins": [2.0, 0.03, 1.0]}, ref)
    assert merge.consistent({"tokens": ["a", "x", "y"], "margins": [2.0, 0.03, 1.0]}, ref)  # near-tie at 1
    assert not merge.consistent({"tokens": ["z", "b", "c"], "margins": [1.5, 0.03, 1.0]}, ref)  # a clear win lost
    assert merge.consistent({"text": "abc"}, ref) is None


def test_stream_logprobs_reads_vllm_chunks():
    client = load("client")
    import http.server
    import threading

    chunks = [{"choices": [{"text": "he", "logprobs": {"tokens": ["he"], "top_logprobs": [{"he": -0.1, "ha": -2.1}]}}]},
              {"choices": [{"text": "y", "logprobs": {"tokens": ["y"], "top_logprobs": [{"y": -0.5}]}}]},
              {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 544}}}]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for c in chunks:
                self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        seen = client.stream_logprobs(f"http://127.0.0.1:{server.server_address[1]}", {"prompt": [1, 2], "logprobs": 2})
    finally:
        server.shutdown()
    assert seen["text"] == "hey" and seen["tokens"] == ["he", "y"] and seen["margins"] == [2.0, None]
    assert len(seen["arrivals"]) == 2 and client.cached_of(seen["usage"]) == 544


class FakeSetup:
    """A set-up whose engine answers every request in 50 ms with the tokens it was asked for."""

    def __init__(self):
        self.bodies: list[dict] = []

    def transfer_counters(self) -> dict:
        return {"bytes": 0.0, "descriptors": 0.0, "transfers": 0.0, "transfer_seconds": 0.0,
                "failed_transfers": 0.0}

    def placement_rates(self) -> dict:
        return {"hop_ms": 15.0 + len(self.bodies), "next_remote": 0.5}  # as our proxy had learned them by then

    def send(self, body: dict) -> dict:
        import time

        self.bodies.append(body)
        time.sleep(0.05)
        n = body["max_tokens"]
        return {"arrivals": [0.01 + 0.001 * i for i in range(n)], "e2e_s": 0.05, "hit_tokens": 0, "p_s": None,
                "usage": {"completion_tokens": n}, "text": "t" * n}


def test_trace_runs_closed_and_open_loop_and_merge(bench, tokens, tmp_path):
    from benchmarks.fleetsim_trace import TraceRequest
    from benchmarks.trace_replay import to_requests

    trace = [TraceRequest(0.0, 128, 3, [1], "a", 0), TraceRequest(10.0, 128, 4, [2], "b", 0),
             TraceRequest(20.0, 200, 5, [1, 3], "a", 1, 20.0), TraceRequest(40.0, 250, 6, [2, 4], "b", 1, 20.0)]
    reqs = to_requests(trace, tokens, 128)
    fake = FakeSetup()
    closed = bench.run_requests(fake, reqs, 2, 64, {"workload": "trace", "length": 170, "concurrency": 2})
    assert sorted((r["session"], r["turn"], r["completion_tokens"]) for r in closed["rows"]) == [
        ("a", 0, 3), ("a", 1, 5), ("b", 0, 4), ("b", 1, 6)]
    assert closed["wall_s"] >= 0.05 + 0.02 + 0.05  # a turn, its think time, the next turn
    tag = {"workload": "trace@100/s", "length": 170, "concurrency": 0}
    opened = bench.run_requests(fake, reqs, 0, 64, tag, rate=100.0)  # 3 gaps in 30 ms: all in flight at once
    assert [r["due_s"] for r in opened["rows"]] == pytest.approx([0.0, 0.0075, 0.015, 0.03])
    assert all(0 <= r["late_s"] < 0.04 for r in opened["rows"])
    assert opened["wall_s"] < 0.03 + 0.05 + 0.04  # no request waited for another to end
    merge = load("gpu.merge")
    result = {"setup": "colocated", "tag": "", "args": {}, "probe": [], "errors": [], "block": 128, "runs": []}
    for run, t in ((closed, {"workload": "trace", "length": 170, "concurrency": 2}), (opened, tag)):
        bench.record(result, run, reqs, 128, t)
    (tmp_path / "part-colocated.json").write_text(json.dumps(result))
    res = merge.merge(tmp_path, 8192)
    assert {(t["workload"], t["concurrency"], t["n"]) for t in res["tables"]} == {("trace", 2, 4),
                                                                                 ("trace@100/s", 0, 4)}
    assert {t["oracle"] for t in res["tables"]} == {128 * 2}  # the second turns reuse their first block
    assert "| trace@100/s | 170 | 0 | colocated |" in merge.summary_md(res, "t")


def test_packed_logs_keep_every_turns_load_and_placement_lines(tmp_path):
    """A run's slow turn is read afterwards from the decoder's load lines and the proxy's placement lines: a
    digest that kept only the last 600 interesting lines lost the c=1 turns of a run (2026-11-26)."""
    import tarfile

    from benchmarks.gpu.bench import pack_logs

    logs = tmp_path / "logs"
    logs.mkdir()
    lines = []
    for i in range(1500):
        lines += [f"INFO [scheduler_side.py:240] request cmpl-pd-x-{i}-0: load 4641 tokens from e, local hit 0",
                  "INFO:     127.0.0.1:59254 - \"POST /v1/completions HTTP/1.1\" 200 OK",
                  f"INFO hybrid_pd.proxy: placement pd-x-{i}: TTFT 115.6 ms (predicted 106.8), local_prefill"]
    (logs / "decode.log").write_text("\n".join(lines) + "\n")
    pack_logs(logs, tmp_path / "logs.tar.gz")
    with tarfile.open(tmp_path / "logs.tar.gz") as tar:
        f = tar.extractfile("decode.log")
        assert f is not None
        text = f.read().decode()
    assert all(f"cmpl-pd-x-{i}-0: load" in text and f"placement pd-x-{i}:" in text for i in range(1500))
    assert text.count("POST /v1/completions") <= 200  # the tail's; the rest is left out


def test_proxy_variants_run_on_the_same_engines_with_prompts_of_their_own(bench, tokens, tmp_path):
    """--proxy-variants: after the set-up's workloads, each variant gets a fresh proxy with its flags (the engines
    stay) and the same workloads with other prompts (the engines cached the first ones): a part of its own."""
    import argparse

    class FakeProxySetup(FakeSetup):
        def __init__(self):
            super().__init__()
            self.restarts: list[tuple[tuple[str, ...], str]] = []

        metric_urls: dict = {}  # the probe's /metrics scrapes: none here

        def restart_proxy(self, extra, name):
            self.restarts.append((extra, name))

    args = argparse.Namespace(workloads="agentic", lengths="2048", concurrency="1", trace="", rate="", deadline_s=1e9,
                              max_tokens=2, out=tmp_path, tag="", proxy_args="--log-placement", probe_length=1024,
                              proxy_variants="--pd-policy isl-bounding;--itl-slo-ms 60")
    fake = FakeProxySetup()
    result = {"setup": "hybrid-pd-1p1d", "tag": "", "args": {"proxy_args": "--log-placement"}, "probe": [],
              "errors": [], "block": 128, "runs": []}
    bench.matrix(fake, tokens, args, 128, result, lambda: None)
    first = [tuple(b["prompt"][:128]) for b in fake.bodies]
    parts = bench.run_variants(fake, tokens, args, 128, result, "hybrid-pd-1p1d")
    assert [p.name for p in parts] == ["part-hybrid-pd-1p1d-isl-bounding.json",
                                       "part-hybrid-pd-1p1d-itl-slo-ms-60.json"]
    assert fake.restarts == [(("--pd-policy", "isl-bounding"), "proxy-isl-bounding"),
                             (("--itl-slo-ms", "60"), "proxy-itl-slo-ms-60")]
    saved = [json.loads(p.read_text()) for p in parts]
    assert [s["tag"] for s in saved] == ["-isl-bounding", "-itl-slo-ms-60"]
    assert saved[0]["args"]["proxy_args"] == "--log-placement --pd-policy isl-bounding"
    assert all(len(s["runs"]) == 1 and len(s["runs"][0]["rows"]) == len(first) for s in saved)
    # each variant: its own phase probe (6 requests alone), then its workloads, with prompts of their own
    probes = [[tuple(b["prompt"][:128]) for b in fake.bodies[len(first) + k * (6 + len(first)):][:6]] for k in (0, 1)]
    later = [tuple(b["prompt"][:128]) for k in (0, 1)
             for b in fake.bodies[len(first) + k * (6 + len(first)) + 6:][:len(first)]]
    assert [len(s["probe"]) for s in saved] == [6, 6] and [p["phase"] for p in saved[0]["probe"]][::3] == ["cold",
                                                                                                           "warm"]
    assert len(fake.bodies) == len(first) + 2 * (6 + len(first))
    assert not set(later) & set(first) and not set(probes[0]) & set(probes[1])  # no first block in common: no hit
    assert not set(later[: len(first)]) & set(later[len(first):])
    assert len(result["runs"]) == 1  # the variants record into parts of their own
    # each cell records our proxy's placement model as learned by its end, and merge shows it per cell
    assert result["runs"][0]["placement_rates"] == {"hop_ms": 15.0 + len(first), "next_remote": 0.5}
    (tmp_path / "part-hybrid-pd-1p1d.json").write_text(json.dumps(result))
    text = merge_summary(tmp_path)
    assert "The placement model's rates" in text
    assert f"| agentic | 2048 | 1 | hybrid-pd-1p1d | - | - | - | {15.0 + len(first):.4g} |" in text


def test_pd_tax_comes_from_the_always_remote_variant_where_ours_served_the_probe_alone(tmp_path):
    """pd_overhead_ms_c1: the median PD tax over ours' probe turns that went through P; where ours served every probe
    turn on D alone, its always-remote variant's (the PD path's own tax, same engines). proxy_added_ms_p50: ours'
    D-alone probe turns' TTFT beyond D's own, less the colocated engine's on the same turns."""
    merge = load("gpu.merge")

    def probe_row(phase, turn, ttft, p_prefill=None):  # deltas as metric_deltas writes them (s sums and counts)
        d = {"vllm:request_prefill_time_seconds_sum": 0.080, "vllm:request_prefill_time_seconds_count": 1,
             "vllm:time_to_first_token_seconds_sum": 0.082}  # the engine's own arrival to first token
        deltas = {"decode": d}
        if p_prefill is not None:
            deltas["prefill"] = {"vllm:request_prefill_time_seconds_sum": p_prefill,
                                 "vllm:request_prefill_time_seconds_count": 1}
        return {"phase": phase, "turn": turn, "prompt_tokens": 4000, "oracle_hit": 0, "hit_tokens": 0,
                "ttft_s": ttft, "p_s": p_prefill and p_prefill + 0.005, "e2e_s": ttft + 0.1, "text": "x",
                "deltas": deltas}

    col = part("colocated", [row("a", 0, 0.10, "x")], [row("a", 0, 0.3, "z", conc=8)], (100, 800))
    col["probe"] = [probe_row("cold", 0, 0.090)]  # its own HTTP path: 90 - 80 = 10 ms
    ours = part("hybrid-pd-1p1d", [row("a", 0, 0.15, "x")], [row("a", 0, 0.9, "w", conc=8)], (95, 600))
    ours["probe"] = [probe_row("cold", 0, 0.095)]  # D alone: no PD turn
    remote = dict(part("hybrid-pd-1p1d", [row("a", 0, 0.2, "x")], [row("a", 0, 0.9, "w", conc=8)], (95, 600)),
                  tag="-always-remote")
    remote["probe"] = [probe_row("cold", 0, 0.200, p_prefill=0.095)]  # 200 - 95 - 80 - 10 = 15 ms
    for name, p in (("colocated", col), ("hybrid-pd-1p1d", ours), ("hybrid-pd-1p1d-always-remote", remote)):
        (tmp_path / f"part-{name}.json").write_text(json.dumps(p))
    res = merge.merge(tmp_path, 8192)
    assert res["ratios"]["pd_overhead_ms_c1"] == pytest.approx(15.0)
    assert res["ratio_basis"]["pd_overhead_from"] == "hybrid-pd-1p1d-always-remote"
    # what the proxy adds on a D-alone turn: (95 - 82) through it against (90 - 82) straight to the colocated engine
    assert res["ratios"]["proxy_added_ms_p50"] == pytest.approx(5.0)


def merge_summary(folder) -> str:
    merge = load("gpu.merge")
    return merge.summary_md(merge.merge(folder, 2048), "t")
