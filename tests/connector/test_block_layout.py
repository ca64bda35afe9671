"""Which KV-cache tensors the connector can move block by block as one byte range each, and the test hooks that
spoil landed blocks on purpose (the negative controls' bytes)."""

import torch

from hybrid_pd.connector.plan import Run
from hybrid_pd.connector.vllm_kv_caches import KvCacheLayout, block_is_dense


def test_dense_blocks_in_any_inner_order_are_accepted():
    assert block_is_dense(torch.empty(10, 2, 80, 128))
    # vLLM 0.26's GPU attention cache: K/V interleaved per token, strides (20480, 128, 256, 1)
    gpu_layout = torch.empty(10, 80, 2, 128).permute(0, 2, 1, 3)
    assert gpu_layout.stride() == (20480, 128, 256, 1) and block_is_dense(gpu_layout)


def test_padded_block_stride_is_accepted_but_holes_inside_a_block_are_not():
    assert block_is_dense(torch.empty(10, 4096)[:, :4000])  # page padding after the block's bytes
    assert not block_is_dense(torch.empty(10, 2, 80, 128)[:, :, :40])
    assert not block_is_dense(torch.empty(10, 2, 80, 128)[:, :, :, ::2])


def layout_of(groups: dict[int, list[torch.Tensor]]) -> KvCacheLayout:
    return KvCacheLayout(by_group=groups)


def test_scramble_attention_spoils_only_the_last_landed_attention_block_of_each_group():
    attn = [torch.randn(8, 2, 4, 16) for _ in range(2)]  # two layers of one attention group
    state = [torch.randn(8, 64)]
    before = [t.clone() for t in (*attn, *state)]
    runs = [Run(0, 1, 11, 2), Run(0, 5, 20, 2), Run(1, 3, 30, 1)]  # attention blocks 1, 2, 5, 6; state block 3
    layout_of({0: attn, 1: state}).corrupter("scramble-attention", ["attention", "mamba"])(runs)
    for layer, (t, old) in enumerate(zip(attn, before)):
        changed = [b for b in range(8) if not torch.equal(t[b], old[b])]
        assert changed == [6], layer  # the last block of the last run: the one nearest the boundary
        assert t[6].abs().max() > 4 * old[6].abs().max() / 2  # noise far past the block's own magnitude
    assert torch.equal(state[0], before[2])  # the state is right
    assert not torch.equal(attn[0][6], attn[1][6])  # each layer its own noise


def test_zero_state_zeroes_every_landed_mamba_block_and_nothing_else():
    attn, state = [torch.randn(8, 2, 4, 16)], [torch.randn(8, 64)]
    before = attn[0].clone()
    layout_of({0: attn, 1: state}).corrupter("zero-state", ["attention", "mamba"])([Run(0, 1, 11, 2), Run(1, 3, 30, 2)])
    assert torch.equal(attn[0], before)
    assert [b for b in range(8) if not bool(state[0][b].any())] == [3, 4]
