"""vLLM's KV-cache events as they arrive on the wire, decoded without importing vLLM.

Mirrors vllm/distributed/kv_events.py (0.26-0.32). A publisher sends three ZMQ frames per batch:

    [topic bytes] [seq: 8-byte big-endian uint] [payload: msgpack of KVEventBatch]

KVEventBatch is an array [ts, events, data_parallel_rank]; each event is a map tagged by its class name
under "type" ("BlockStored" | "BlockRemoved" | "AllBlocksCleared"). Fields a newer vLLM adds are ignored;
`group_idx` / `kv_cache_spec_kind` arrived with hybrid models (absent: one full-attention group 0).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..errors import UpstreamError

BlockHashKey = bytes | int  # sha256 bytes, or an int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1


class KVCacheEvent(msgspec.Struct, tag=True):  # every field encoded: vLLM requires lora_id, medium, ...
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[BlockHashKey]
    parent_block_hash: BlockHashKey | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[BlockHashKey]
    medium: str | None = None
    group_idx: int | None = None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True):
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


class EventDecodeError(UpstreamError):
    """A frame set that is not a vLLM KV-event batch (wrong version, wrong socket)."""


_decoder = msgspec.msgpack.Decoder(KVEventBatch)
_encoder = msgspec.msgpack.Encoder()
END_SEQ = (-1).to_bytes(8, "big", signed=True)  # replay's end-of-sequence marker


def decode_frames(frames: list[bytes]) -> tuple[int, KVEventBatch]:
    """(seq, batch) from one multipart message; raises EventDecodeError naming what did not match."""
    if len(frames) != 3:
        raise EventDecodeError(f"KV event message has {len(frames)} frames, expected 3 (topic, seq, payload)")
    _, seq_bytes, payload = frames
    if len(seq_bytes) != 8:
        raise EventDecodeError(f"KV event sequence frame has {len(seq_bytes)} bytes, expected 8")
    try:
        batch = _decoder.decode(payload)
    except msgspec.DecodeError as e:
        raise EventDecodeError(f"KV event payload is not a vLLM KVEventBatch this proxy understands: {e}") from None
    return int.from_bytes(seq_bytes, "big"), batch


def encode_frames(batch: KVEventBatch, seq: int, topic: bytes = b"") -> list[bytes]:
    """What a vLLM publisher sends; used by the tests' fake publishers."""
    return [topic, seq.to_bytes(8, "big"), _encoder.encode(batch)]
