"""Wire messages: the handshake, the kv_transfer_params P returns, D's notifications to P, and the outcome of P's
call that the proxy delivers to an early decode's params inbox.

All are msgspec Structs carrying `PROTOCOL_VERSION`. `Handshake.check_compatible` and the decoders fail
with `IncompatiblePeer` / `BadTransferParams` and a message saying what differs, never with a bare
msgspec error.
"""

from __future__ import annotations

import msgspec

from hybrid_pd.connector.errors import BadTransferParams, IncompatiblePeer, ProtocolError

PROTOCOL_VERSION = 1


class Region(msgspec.Struct, frozen=True):
    """One layer's blocks in memory: block `b` lives at `base + b * stride`, `length` bytes of it move."""

    layer: str
    group: int
    base: int
    stride: int
    length: int
    num_blocks: int

    @property
    def blocks_abut(self) -> bool:
        return self.length == self.stride


class Handshake(msgspec.Struct, frozen=True):
    """What a worker tells a peer that asks on its side channel."""

    version: int
    engine_id: str
    tp_rank: int
    agent_name: str
    agent_metadata: bytes
    group_kinds: list[str]
    block_sizes: list[int]
    regions: list[Region]
    mem_type: str = "DRAM"
    tp_size: int = 1

    def check_compatible(self, local: Handshake) -> None:
        """Raise IncompatiblePeer unless this (remote) handshake can feed `local` block for block."""
        problems = []
        if self.version != local.version:
            problems.append(f"protocol version {self.version} != ours {local.version} (upgrade both sides)")
        if self.tp_size != local.tp_size:
            problems.append(
                f"tensor-parallel size {self.tp_size} != ours {local.tp_size}: P and D with different TP sizes are "
                "not supported yet (each rank reads its own rank's heads); start both with the same "
                "--tensor-parallel-size"
            )
        if self.group_kinds != local.group_kinds:
            problems.append(f"KV-cache groups {self.group_kinds} != ours {local.group_kinds}")
        if self.block_sizes != local.block_sizes:
            problems.append(
                f"block sizes {self.block_sizes} != ours {local.block_sizes} (heterogeneous "
                "block sizes are not supported: start both with the same --block-size)"
            )
        ours = {r.layer: r for r in local.regions}
        theirs = {r.layer: r for r in self.regions}
        if set(ours) != set(theirs):
            problems.append(
                f"layers differ: only remote {sorted(set(theirs) - set(ours))[:4]}, only local "
                f"{sorted(set(ours) - set(theirs))[:4]}"
            )
        for name in sorted(set(ours) & set(theirs)):
            if (ours[name].length, ours[name].group) != (theirs[name].length, theirs[name].group):
                problems.append(
                    f"layer {name}: remote moves {theirs[name].length} B per block in group "
                    f"{theirs[name].group}, we {ours[name].length} B in group {ours[name].group} "
                    "(other model, dtype, TP size or conv-state layout)"
                )
                break
        if problems:
            raise IncompatiblePeer(
                f"prefiller {self.engine_id} (rank {self.tp_rank}) cannot feed this decoder: " + "; ".join(problems)
            )


class CheckpointRef(msgspec.Struct, frozen=True):
    """An aligned Mamba state P pinned for D: block `block` of group `group`, state after `tokens` tokens."""

    group: int
    block: int
    tokens: int


class GroupDigests(msgspec.Struct, frozen=True):
    """One KV-cache group's block digests on one TP rank of P: `digests[i]` is block `block_ids[i]`'s."""

    block_ids: list[int]
    digests: list[int]


class BlockDigests(msgspec.Struct, frozen=True):
    """P's integrity digests of a request's blocks (connector/integrity.py): `ranks[r][g]` for TP rank r,
    group g, computed with `algorithm` (connector/kv_digest.py) after the step in which the prompt completed."""

    algorithm: str
    ranks: list[list[GroupDigests]]
    version: int = PROTOCOL_VERSION

    def of_rank(self, rank: int) -> dict[int, dict[int, int]]:
        """group -> block id -> digest, for TP rank `rank` (empty if P sent none for it)."""
        if rank >= len(self.ranks):
            return {}
        return {g: dict(zip(gd.block_ids, gd.digests)) for g, gd in enumerate(self.ranks[rank])}


class RemotePrefill(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """The kv_transfer_params P returns (and D receives with the request)."""

    remote_engine_id: str
    remote_request_id: str
    remote_host: str
    remote_port: int
    remote_block_ids: list[list[int]]
    remote_num_tokens: int
    lease_s: float
    checkpoints: list[CheckpointRef] = []
    # P's encoded `Handshake` per TP rank, so that D needs nothing from P's threads but the READ itself: a
    # prefiller whose side-channel thread is starved on a shared core answered no handshake for tens of
    # seconds (benchmarks/results/2026-11-24-cpu-burst/summary.md). Empty from a prefiller that has none: D
    # asks its side channel.
    handshakes: list[bytes] = []
    digests: BlockDigests | None = None  # absent from a prefiller that computes none
    # P's engine ends a prefill step at a prompt's last aligned boundary (align mode where a Mamba layer writes no
    # state inside the chunk): the proxy's placement prices P's and D's steps by it (its --align-split until told)
    engine_splits: bool = False
    prefill_steps: int = 0  # the engine steps P took to compute the prompt (0: not counted): the proxy's fit learns
    do_remote_prefill: bool = True
    do_remote_decode: bool = False
    hybrid_pd_version: int = PROTOCOL_VERSION

    def to_params(self) -> dict:
        return msgspec.to_builtins(self)


def parse_remote_prefill(params: dict) -> RemotePrefill:
    """D side: the kv_transfer_params of a request, validated (BadTransferParams if unusable)."""
    version = params.get("hybrid_pd_version")
    if version != PROTOCOL_VERSION:
        raise BadTransferParams(
            f"kv_transfer_params of protocol version {version!r}, this decoder speaks "
            f"{PROTOCOL_VERSION}: was the prefiller started with --connector hybrid?"
        )
    try:
        remote = msgspec.convert(params, RemotePrefill)
    except msgspec.ValidationError as e:
        raise BadTransferParams(f"malformed kv_transfer_params: {e}") from None
    digests = remote.digests
    if digests is not None and digests.version != PROTOCOL_VERSION:
        raise BadTransferParams(
            f"KV digests of protocol version {digests.version}, this decoder speaks {PROTOCOL_VERSION}: run the "
            "same hybrid-pd release on prefill and decode"
        )
    return remote


class Notification(msgspec.Struct, frozen=True, tag_field="kind"):
    """D -> P over NIXL notifications: the request's blocks may be freed."""

    request_id: str
    version: int = PROTOCOL_VERSION


class Done(Notification, tag="done", frozen=True):
    """D read everything it needed."""


class Rejected(Notification, tag="rejected", frozen=True):
    """D will not read (failed, aborted, or held the prefix itself)."""

    reason: str = ""


class PrefillOutcome(msgspec.Struct, frozen=True):
    """Proxy -> D's params inbox (early decode, connector/params_inbox.py): how the prefill under transfer key `key`
    ended. `params`: P's kv_transfer_params (D loads them as if the request had carried them); None: P failed,
    timed out or was skipped (`reason`), and D computes the prompt itself."""

    key: str
    params: dict | None = None
    reason: str = ""
    version: int = PROTOCOL_VERSION


_notif_decoder = msgspec.msgpack.Decoder(Done | Rejected)
_outcome_decoder = msgspec.msgpack.Decoder(PrefillOutcome)
_encoder = msgspec.msgpack.Encoder()


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode_notification(data: bytes) -> Done | Rejected:
    try:
        msg = _notif_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ProtocolError(f"unreadable notification {data[:40]!r}: {e}") from None
    if msg.version != PROTOCOL_VERSION:
        raise ProtocolError(f"notification of protocol version {msg.version}, we speak {PROTOCOL_VERSION}")
    return msg


def decode_handshake(data: bytes) -> Handshake:
    try:
        version = msgspec.msgpack.decode(data, type=dict).get("version")
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise IncompatiblePeer(f"unreadable handshake ({len(data)} B): {e}") from None
    if version != PROTOCOL_VERSION:
        raise IncompatiblePeer(
            f"peer speaks hybrid-pd protocol version {version!r}, we speak "
            f"{PROTOCOL_VERSION}: run the same hybrid-pd release on prefill and decode"
        )
    try:
        return msgspec.msgpack.decode(data, type=Handshake)
    except msgspec.ValidationError as e:
        raise IncompatiblePeer(f"handshake of version {version} does not match ours: {e}") from None


def decode_outcome(data: bytes) -> PrefillOutcome:
    try:
        msg = _outcome_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ProtocolError(f"unreadable prefill outcome {data[:40]!r}: {e}") from None
    if msg.version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"prefill outcome of protocol version {msg.version}, this decoder speaks {PROTOCOL_VERSION}: run the "
            "same hybrid-pd release on the proxy and the decoders"
        )
    return msg
