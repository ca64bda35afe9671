"""WorkerConfig: the launcher's validation and the exact command it builds. No vLLM, no engine."""

import json
import socket

import pytest

from hybrid_pd.prefill.launch.errors import WorkerConfigError
from hybrid_pd.prefill.launch.probes import (
    model_kind,
    vllm_has_retention_interval,
    vllm_ignores_mamba_cache_mode,
    vllm_none_hash_is_random,
)
from hybrid_pd.prefill.launch.worker import worker_main
from hybrid_pd.prefill.launch.worker_config import WorkerConfig


def write_config(tmp_path, name, **cfg):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


@pytest.fixture
def hybrid_model(tmp_path):
    return write_config(tmp_path, "hybrid", architectures=["Qwen3NextForCausalLM"],
                        layer_types=["linear_attention", "full_attention"])


@pytest.fixture
def dense_model(tmp_path):
    return write_config(tmp_path, "dense", architectures=["LlamaForCausalLM"])


def make(model, **kw):
    kw.setdefault("check_ports_free", False)
    return WorkerConfig(model=model, **{"role": "prefill", **kw})


def problems_of(model, **kw):
    with pytest.raises(WorkerConfigError) as e:
        make(model, **kw)
    return "\n".join(e.value.problems)


def test_prefill_command_carries_every_validated_setting(hybrid_model):
    cfg = make(hybrid_model, connector="hybrid", port=8100, side_channel_port=5600, kv_events_port=5700,
               cpu_bind="0", kv_cache_gib=2)
    argv = cfg.argv()
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(argv[3::1], argv[4::1]))
    assert flags["--model"] == hybrid_model and flags["--port"] == "8100"
    assert flags["--mamba-cache-mode"] == "align" and "--enable-prefix-caching" in argv
    assert json.loads(flags["--kv-transfer-config"]) == {
        "kv_connector": "HybridPDConnector", "kv_connector_module_path": "hybrid_pd.connector",
        "kv_role": "kv_producer", "kv_load_failure_policy": "recompute", "kv_buffer_device": "cpu"}
    assert json.loads(flags["--kv-events-config"]) == {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://127.0.0.1:5700",
        "topic": "kv-events"}
    env = cfg.env({})
    assert env == {"VLLM_SSM_CONV_STATE_LAYOUT": "DS", "VLLM_HOST_IP": "127.0.0.1",
                   "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600",
                   "NIXL_PTHR_DELAY_US": "1000", "UCX_RCACHE_MAX_UNRELEASED": "1024",
                   "UCX_NET_DEVICES": "lo", "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "0",
                   "HYBRID_PD_KEEP_AFFINITY": "1", "HYBRID_PD_NIXL_PROGRESS_THREAD": "0",
                   "HYBRID_PD_IDLE_WAIT_MS": "2", "HYBRID_PD_SYNC_SCHEDULER_BLOCK": "1"}
    assert cfg.warnings == ()


def test_decode_role_is_a_consumer_and_upstream_is_vllms_nixl(hybrid_model):
    cfg = make(hybrid_model, role="decode", connector="upstream")
    ktc = cfg.kv_transfer_config()
    assert ktc["kv_connector"] == "NixlConnector" and ktc["kv_role"] == "kv_consumer"
    assert "kv_connector_module_path" not in ktc


def test_no_connector_means_a_plain_engine(hybrid_model):
    cfg = make(hybrid_model, connector="none", conv_state_layout="SD")
    assert cfg.kv_transfer_config() is None and "--kv-transfer-config" not in cfg.argv()


def test_hybrid_model_without_prefix_caching_is_refused(hybrid_model):
    assert "remove --no-prefix-caching" in problems_of(hybrid_model, prefix_caching=False)


def test_non_align_mamba_mode_is_refused(hybrid_model):
    assert "use --mamba-cache-mode align" in problems_of(hybrid_model, mamba_cache_mode="all")


def test_sd_layout_with_nixl_is_refused(hybrid_model):
    for connector in ("hybrid", "upstream"):
        assert "use --conv-state-layout DS" in problems_of(hybrid_model, connector=connector,
                                                           conv_state_layout="SD")


def test_colliding_ports_are_refused_and_named(hybrid_model):
    msg = problems_of(hybrid_model, port=5700, kv_events_port=5700)
    assert "--kv-events-port 5700 collides with --port" in msg


def test_side_channel_range_spans_tensor_parallel_ranks(hybrid_model):
    msg = problems_of(hybrid_model, side_channel_port=5600, tensor_parallel_size=2, kv_events_port=5601)
    assert "--side-channel-port 5601 collides with --kv-events-port" in msg
    make(hybrid_model, side_channel_port=5600, tensor_parallel_size=2, kv_events_port=5602)


def test_a_decoders_params_port_reaches_its_connector_and_is_checked_like_the_others(hybrid_model):
    decode = make(hybrid_model, role="decode", params_port=5620, side_channel_port=5610, kv_events_port=5710)
    assert decode.env({})["HYBRID_PD_PARAMS_PORT"] == "5620"
    assert "HYBRID_PD_PARAMS_PORT" not in make(hybrid_model, role="decode").env({})  # none unless asked for
    assert "HYBRID_PD_PARAMS_PORT" not in make(hybrid_model, params_port=5620).env({})  # a prefiller takes none
    msg = problems_of(hybrid_model, role="decode", params_port=5710, side_channel_port=5610, kv_events_port=5710)
    assert "--params-port 5710 collides with --kv-events-port" in msg


def test_port_already_bound_is_refused(hybrid_model):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        msg = problems_of(hybrid_model, port=busy, check_ports_free=True)
    assert f"--port {busy} is already in use" in msg


def test_a_kv_events_port_bound_by_the_proxy_lets_a_restarted_worker_start(hybrid_model):
    """On a concrete address vLLM's publisher connects and the proxy's subscriber binds: the port is busy for
    as long as the proxy lives, which must not stop a crashed worker from rejoining with its own command. On a
    wildcard address the worker binds the port itself, so a busy one is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        make(hybrid_model, kv_events_port=busy, check_ports_free=True)
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        busy = s.getsockname()[1]
        msg = problems_of(hybrid_model, host="0.0.0.0", advertise_host="10.0.0.1", kv_events_port=busy,
                          check_ports_free=True)
    assert f"--kv-events-port {busy} is already in use" in msg


def test_owned_vllm_flags_after_dashdash_are_refused(hybrid_model):
    msg = problems_of(hybrid_model, extra_vllm_args=("--no-enable-prefix-caching", "--dtype", "float32"))
    assert "use the launcher's --no-prefix-caching" in msg
    assert make(hybrid_model, extra_vllm_args=("--dtype", "float32")).argv()[-2:] == ["--dtype", "float32"]


def test_dense_model_warns_but_starts(dense_model):
    cfg = make(dense_model)
    assert any("not a hybrid" in w for w in cfg.warnings)
    make(dense_model, prefix_caching=False)  # allowed: the hybrid rule does not apply


def test_every_problem_is_reported_at_once(hybrid_model):
    with pytest.raises(WorkerConfigError) as e:
        make(hybrid_model, prefix_caching=False, conv_state_layout="SD", port=1, kv_events_port=1)
    assert len(e.value.problems) == 3


@pytest.mark.parametrize("cfg,kind", [
    ({"architectures": ["NemotronHForCausalLM"]}, "hybrid"),
    ({"architectures": ["X"], "hybrid_override_pattern": "M-M*"}, "hybrid"),
    ({"architectures": ["X"], "layers_block_type": ["mamba", "attention"]}, "hybrid"),
    ({"architectures": ["X"], "text_config": {"layer_types": ["linear_attention"]}}, "hybrid"),
    ({"architectures": ["LlamaForCausalLM"], "layer_types": ["full_attention"]}, "attention"),
])
def test_model_kind(tmp_path, cfg, kind):
    assert model_kind(write_config(tmp_path, "m", **cfg)) == kind


def test_model_kind_of_an_unreadable_model_is_unknown(tmp_path):
    assert model_kind(str(tmp_path / "missing")) == "unknown"


def test_cli_refuses_with_exit_2_and_names_the_flag(hybrid_model, capsys):
    code = worker_main("decode", ["--model", hybrid_model, "--no-prefix-caching"])
    assert code == 2
    assert "remove --no-prefix-caching" in capsys.readouterr().err


def test_gpu_workers_let_ucx_read_over_cuda_ipc_without_nvlink_unless_the_user_said_otherwise(hybrid_model):
    gpu = make(hybrid_model, device="gpu")
    assert gpu.env({})["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "on"
    assert gpu.env({"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "auto"})["UCX_CUDA_IPC_ENABLE_GET_ZCOPY"] == "auto"
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in make(hybrid_model).env({})  # CPU: no CUDA memory to read
    assert "UCX_CUDA_IPC_ENABLE_GET_ZCOPY" not in make(hybrid_model, device="gpu", connector="none").env({})


def test_wildcard_bind_advertises_the_pod_ip(hybrid_model, monkeypatch):
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    env = make(hybrid_model, host="0.0.0.0").env({})
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == env["VLLM_HOST_IP"] == "10.1.2.3"
    assert "UCX_NET_DEVICES" not in env
    assert make(hybrid_model, host="0.0.0.0", advertise_host="w1").env({})["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "w1"
    monkeypatch.delenv("POD_IP")
    assert "pass --advertise-host" in problems_of(hybrid_model, host="0.0.0.0")


def test_launchers_pin_pythonhashseed_only_where_vllm_would_seed_block_hashes_randomly(hybrid_model):
    v026 = "    if hash_seed is None:\n        NONE_HASH = BlockHash(os.urandom(32))\n"
    v032 = 'DEFAULT_NONE_HASH_SEED = "vllm-none-hash"\n' + v026
    assert vllm_none_hash_is_random(v026) and not vllm_none_hash_is_random(v032)
    assert not vllm_none_hash_is_random()  # the test bed's vllm-cpu 0.32: nothing to pin
    assert make(hybrid_model).env({"PYTHONHASHSEED": "5"})["PYTHONHASHSEED"] == "5"  # the operator's wins


def test_checkpoint_every_keeps_mamba_states_at_every_boundary_and_ends_chunks_there(hybrid_model):
    cfg = make(hybrid_model, checkpoint_every=256)
    flags = dict(zip(cfg.argv(), cfg.argv()[1:]))
    assert flags["--prefix-cache-retention-interval"] == "256" and flags["--max-num-batched-tokens"] == "256"
    assert any("caps a step at 256" in w for w in cfg.warnings)
    assert "--prefix-cache-retention-interval" not in make(hybrid_model).argv()
    assert "--checkpoint-every -1" in problems_of(hybrid_model, checkpoint_every=-1)
    assert "--checkpoint-every" in problems_of(hybrid_model, extra_vllm_args=("--prefix-cache-retention-interval",
                                                                              "512"))


@pytest.mark.parametrize("bind, cores", [("0", {0}), ("0-1", {0, 1}), ("1,0", {0, 1}), ("0|1", {0, 1}),
                                         ("auto", None), ("nobind", None)])
def test_cpu_bind_names_the_cores_the_launcher_pins_itself_to(hybrid_model, bind, cores):
    assert make(hybrid_model, cpu_bind=bind).cpu_cores == cores
    assert make(hybrid_model, cpu_bind=bind, device="gpu").cpu_cores is None


def test_cpu_bind_outside_this_machine_or_unparsable_is_refused(hybrid_model):
    assert "are not available here" in problems_of(hybrid_model, cpu_bind="4096")
    assert "give cores like 0, 0-3" in problems_of(hybrid_model, cpu_bind="zero")


def test_checkpoint_every_on_a_vllm_without_the_retention_flag_only_caps_the_step(hybrid_model, monkeypatch):
    """vLLM 0.26 (the GPU image) has no --prefix-cache-retention-interval and would refuse to start; its align mode
    keeps the state at every step's end on a block boundary, which the step cap provides."""
    v026 = 'mamba_cache_mode: MambaCacheMode = "none"\n'
    v032 = v026 + "prefix_cache_retention_interval: int | None = Field(default=0, ge=0)\n"
    assert vllm_has_retention_interval(v032) and not vllm_has_retention_interval(v026)
    assert vllm_has_retention_interval()  # the test bed's vllm-cpu 0.32
    monkeypatch.setattr("hybrid_pd.prefill.launch.worker_config.vllm_has_retention_interval", lambda: False)
    argv = make(hybrid_model, checkpoint_every=256).argv()
    assert "--prefix-cache-retention-interval" not in argv
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "256"


def test_mamba_cache_mode_is_left_to_a_vllm_that_deprecates_it(hybrid_model, monkeypatch):
    """vLLM 0.33 warns that --mamba-cache-mode has no effect (align mode follows --enable-prefix-caching): the
    launcher leaves it out there; the test bed's 0.32 (and the GPU image's 0.26) still need it."""
    v033 = 'logger.warning("--mamba-cache-mode is deprecated and will be removed in v0.33.0. It has no effect")\n'
    assert vllm_ignores_mamba_cache_mode(v033) and not vllm_ignores_mamba_cache_mode("mamba_cache_mode = 'align'\n")
    assert not vllm_ignores_mamba_cache_mode()  # the test bed's vllm-cpu 0.32
    argv = make(hybrid_model).argv()
    assert argv[argv.index("--mamba-cache-mode") + 1] == "align" and "--enable-prefix-caching" in argv
    monkeypatch.setattr("hybrid_pd.prefill.launch.worker_config.vllm_ignores_mamba_cache_mode", lambda: True)
    argv = make(hybrid_model).argv()
    assert "--mamba-cache-mode" not in argv and "--enable-prefix-caching" in argv
