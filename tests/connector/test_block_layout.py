"""Which KV-cache tensors the connector can move block by block as one byte range each."""

import torch

from hybrid_pd.connector.vllm_kv_caches import block_is_dense


def test_dense_blocks_in_any_inner_order_are_accepted():
    assert block_is_dense(torch.empty(10, 2, 80, 128))
    # vLLM 0.26's GPU attention cache: K/V interleaved per token, strides (20480, 128, 256, 1)
    gpu_layout = torch.empty(10, 80, 2, 128).permute(0, 2, 1, 3)
    assert gpu_layout.stride() == (20480, 128, 256, 1) and block_is_dense(gpu_layout)


def test_padded_block_stride_is_accepted_but_holes_inside_a_block_are_not():
    assert block_is_dense(torch.empty(10, 4096)[:, :4000])  # page padding after the block's bytes
    assert not block_is_dense(torch.empty(10, 2, 80, 128)[:, :, :40])
    assert not block_is_dense(torch.empty(10, 2, 80, 128)[:, :, :, ::2])
