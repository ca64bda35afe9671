"""The launchers say which aligned block vLLM picked, and warn when the flags cannot use it."""

from hybrid_pd.prefill.aligned_block import AlignedBlockWatch, user_block_size

# as vLLM 0.32 prints them (worker log, then engine core)
GROWN = ("(Worker pid=6235) INFO 11-23 20:01:32 [interface.py:1096] Setting attention block size to 256 tokens "
         "to ensure that attention page size is >= mamba page size.")
SIZED_032 = ("(EngineCore pid=6224) INFO 11-23 20:01:33 [kv_cache_utils.py:2328] CPU KV cache size: 23,552 tokens, "
             "Maximum concurrency for 2,048 tokens per request: 11.50x")
LCM = "(EngineCore pid=6224) INFO 11-23 20:01:32 [kv_cache_utils.py:854] kv lcm block sizes 8320"
# as vLLM 0.26 prints them on a GPU (interface.py, kv_cache_utils.py)
BACKEND = ("(EngineCore pid=812) INFO 11-24 10:02:11 [interface.py:636] Setting kv cache block size to 64 for "
           "FLASHINFER backend.")
SIZED_026 = "(EngineCore pid=812) INFO 11-24 10:02:14 [kv_cache_utils.py:2177] GPU KV cache size: 1,204,224 tokens"


def test_block_is_reported_once_when_the_engine_core_sized_its_kv_cache():
    watch = AlignedBlockWatch(max_model_len=2048)
    assert watch.feed("unrelated line") == []
    assert watch.feed(GROWN) == [] and watch.block is None  # a later phase may still grow it
    assert watch.feed(SIZED_032) == ["aligned block: 256 tokens (prefix hits and Mamba checkpoints fall on "
                                     "multiples of it)"]
    assert watch.feed(LCM) == [] and watch.block == 256


def test_a_block_vllm_never_changed_is_its_starting_block():
    """vLLM 0.26 logs no block when the Mamba page fits its default GPU block (the tiny Zamba2)."""
    watch = AlignedBlockWatch(max_model_len=4096)
    notes = watch.feed(SIZED_026)
    assert watch.block == 16 and notes[0].startswith("aligned block: 16 tokens") and "kept its starting" in notes[0]
    assert AlignedBlockWatch(4096, user_block=32).feed(SIZED_026)[0].startswith("aligned block: 32 tokens")
    backend = AlignedBlockWatch(4096)
    backend.feed(BACKEND)
    assert backend.feed(SIZED_026)[0] == ("aligned block: 64 tokens (prefix hits and Mamba checkpoints fall on "
                                          "multiples of it)")


def test_the_user_block_size_is_read_from_the_vllm_flags():
    assert user_block_size(("--block-size", "32")) == 32
    assert user_block_size(("--enforce-eager", "--block-size=48")) == 48
    assert user_block_size(("--block-size", "x")) is None and user_block_size(()) is None


def test_the_nemotron_super_cliff_and_a_misaligned_checkpoint_interval_are_named():
    """vLLM #48401: an 8,320-token block under max_model_len 4,096 never produced a hit."""
    notes = AlignedBlockWatch(max_model_len=4096, checkpoint_every=10000).feed(LCM)
    assert "raise --max-model-len to at least 16640" in notes[1]
    assert "--checkpoint-every 10000 is not a multiple of the aligned block (8320): set it to 8320" in notes[2]
