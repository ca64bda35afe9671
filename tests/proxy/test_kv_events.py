"""KV-event decoding against what vLLM itself encodes and publishes (vllm imported here only)."""

from __future__ import annotations

import asyncio
import os

import msgspec
import pytest
import vllm.distributed.kv_events as vk  # a moved module fails loudly, never skips
import zmq.asyncio

from hybrid_pd.proxy.kv.block_hash import block_key
from hybrid_pd.proxy.kv.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventDecodeError,
    decode_frames,
    encode_frames,
)
from hybrid_pd.proxy.kv.index import KVIndex
from hybrid_pd.proxy.kv.subscriber import subscribe
from hybrid_pd.proxy.metrics import ProxyMetrics
from hybrid_pd.proxy.workers import Worker
from tests.proxy.fakes import run


def vllm_batch(seq_hash: bytes = b"\x01" * 32):
    return vk.KVEventBatch(ts=1.5, events=[
        vk.BlockStored(block_hashes=[seq_hash, b"\x02" * 32], parent_block_hash=None, token_ids=list(range(8)),
                       block_size=4, lora_id=None, medium="GPU", lora_name=None, group_idx=0,
                       kv_cache_spec_kind="full_attention"),
        vk.BlockStored(block_hashes=[b"\x02" * 32], parent_block_hash=seq_hash, token_ids=list(range(4, 8)),
                       block_size=4, lora_id=None, medium="GPU", lora_name=None, group_idx=3,
                       kv_cache_spec_kind="mamba", extra_keys=[None], session_id="s"),
        vk.BlockRemoved(block_hashes=[b"\x09" * 32], medium="GPU", group_idx=3),
        vk.AllBlocksCleared(),
    ], data_parallel_rank=0)


def test_decodes_vllm_encoded_batch():
    payload = msgspec.msgpack.Encoder().encode(vllm_batch())
    seq, batch = decode_frames([b"kv-events", (41).to_bytes(8, "big"), payload])
    assert seq == 41 and batch.ts == 1.5 and batch.data_parallel_rank == 0
    a, m, r, c = batch.events
    assert isinstance(a, BlockStored) and a.group_idx == 0 and a.kv_cache_spec_kind == "full_attention"
    assert a.block_hashes == [b"\x01" * 32, b"\x02" * 32] and a.block_size == 4 and a.token_ids == list(range(8))
    assert isinstance(m, BlockStored) and m.group_idx == 3 and m.kv_cache_spec_kind == "mamba"
    assert isinstance(r, BlockRemoved) and r.block_hashes == [b"\x09" * 32] and r.group_idx == 3
    assert isinstance(c, AllBlocksCleared)


def test_our_encoding_is_vllm_decodable():
    ours = encode_frames(decode_frames([b"", (0).to_bytes(8, "big"),
                                        msgspec.msgpack.Encoder().encode(vllm_batch())])[1], 7)
    back = msgspec.msgpack.Decoder(vk.KVEventBatch).decode(ours[2])
    assert back.events[1].kv_cache_spec_kind == "mamba" and back.events[1].group_idx == 3


@pytest.mark.parametrize("frames", [[b"a", b"b"], [b"", b"123", b""], [b"", b"\x00" * 8, b"\x93\x01"],
                                    [b"", b"\x00" * 8, b"junk"]])
def test_bad_frames_raise_a_named_error(frames):
    with pytest.raises(EventDecodeError):
        decode_frames(frames)


def test_subscriber_follows_vllm_publisher(tmp_path):
    """vLLM's own ZmqEventPublisher (its thread, its framing) -> our asyncio subscriber -> the index."""
    endpoint = f"ipc://{tmp_path}/kv-{os.getpid()}"  # ipc: binds locally, nothing on the network

    async def body():
        pub = vk.ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint, topic="kv-events")
        ctx = zmq.asyncio.Context()
        index, worker = KVIndex(), Worker("http://w:1", "decode", endpoint)
        task = asyncio.create_task(subscribe(ctx, worker, index, ProxyMetrics()))
        try:
            while worker.url not in index.workers:  # slow joiner: publish until the SUB is connected
                pub.publish(vk.KVEventBatch(ts=0.0, events=[]))
                await asyncio.sleep(0.02)
            pub.publish(vk.KVEventBatch(ts=0.0, events=vllm_batch().events[:2]))
            while not index.held(worker.url).get(3):
                await asyncio.sleep(0.01)
            assert index.held(worker.url)[0] == {block_key(b"\x01" * 32), block_key(b"\x02" * 32)}
            assert index.specs[3].kind == "mamba" and index.specs[0].block_size == 4
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            ctx.term()
            pub.shutdown()
    run(body(), timeout=20)
