"""The launchers say which aligned block vLLM picked, and warn when the flags cannot use it."""

from hybrid_pd.prefill.launch.aligned_block import AlignedBlockWatch

# as vLLM 0.32 prints them (worker log, then engine core)
GROWN = ("(Worker pid=6235) INFO 11-23 20:01:32 [interface.py:1096] Setting attention block size to 256 tokens "
         "to ensure that attention page size is >= mamba page size.")
LCM = "(EngineCore pid=6224) INFO 11-23 20:01:32 [kv_cache_utils.py:854] kv lcm block sizes 8320"


def test_block_is_reported_once_and_fine_flags_get_no_warning():
    watch = AlignedBlockWatch(max_model_len=2048)
    assert watch.feed("unrelated line") == []
    assert watch.feed(GROWN) == ["aligned block: 256 tokens (prefix hits and Mamba checkpoints fall on "
                                 "multiples of it)"]
    assert watch.feed(LCM) == [] and watch.block == 256


def test_the_nemotron_super_cliff_and_a_misaligned_checkpoint_interval_are_named():
    """Nemotron-3-Super upstream: an 8,320-token block under max_model_len 4,096 never produced a hit."""
    notes = AlignedBlockWatch(max_model_len=4096, checkpoint_every=10000).feed(LCM)
    assert "raise --max-model-len to at least 16640" in notes[1]
    assert "--checkpoint-every 10000 is not a multiple of the aligned block (8320): set it to 8320" in notes[2]


def test_where_vllm_logs_no_block_our_connector_names_the_engine_cores():
    """vLLM 0.26 on a GPU kept its starting block (16) for the tiny Zamba2 and logged no block line."""
    watch = AlignedBlockWatch(max_model_len=2048)
    line = ("(EngineCore pid=311) INFO 11-24 09:31:02 [vllm_glue.py:96] hybrid-pd connector: KV-cache groups "
            "mamba 16, mamba 16, attention 16, blocks of 16 tokens")
    assert watch.feed(line)[0].startswith("aligned block: 16 tokens") and watch.block == 16
