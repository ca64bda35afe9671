"""Wire messages round-trip, and every incompatibility fails with a message that says what differs."""

import msgspec
import pytest

from hybrid_pd.connector.errors import BadTransferParams, IncompatiblePeer, ProtocolError
from hybrid_pd.connector.messages import (
    PROTOCOL_VERSION,
    CheckpointRef,
    Done,
    Handshake,
    Region,
    Rejected,
    RemotePrefill,
    decode_handshake,
    decode_notification,
    encode,
    parse_remote_prefill,
)


def handshake(**over) -> Handshake:
    base = dict(version=PROTOCOL_VERSION, engine_id="p0", tp_rank=0, agent_name="p0-0", agent_metadata=b"md",
                group_kinds=["mamba", "attention"], block_sizes=[256, 256],
                regions=[Region("l0", 0, 4096, 131072, 68608, 8), Region("l1", 1, 4096, 131072, 131072, 8)])
    return Handshake(**{**base, **over})


def test_handshake_round_trips_and_accepts_a_twin():
    h = handshake()
    back = decode_handshake(encode(h))
    assert back == h
    back.check_compatible(handshake(engine_id="d0", regions=[Region("l0", 0, 1, 2, 68608, 3),
                                                             Region("l1", 1, 1, 2, 131072, 3)]))


@pytest.mark.parametrize("over,words", [
    (dict(version=PROTOCOL_VERSION + 1), "protocol version"),
    (dict(block_sizes=[256, 16]), "block sizes"),
    (dict(group_kinds=["attention", "mamba"]), "KV-cache groups"),
    (dict(regions=[Region("l0", 0, 0, 1, 999, 8), Region("l1", 1, 0, 1, 131072, 8)]), "layer l0"),
    (dict(regions=[Region("x", 0, 0, 1, 68608, 8)]), "layers differ"),
    (dict(tp_size=2), "tensor-parallel size 2 != ours 1: P and D with different TP sizes are not supported"),
])
def test_incompatible_handshake_says_what_differs(over, words):
    with pytest.raises(IncompatiblePeer, match=words):
        handshake(**over).check_compatible(handshake())


def test_a_handshake_without_tp_size_reads_as_tp_1():
    """Workers from before the field existed send none: they ran TP=1 (the field is the last, defaulted)."""
    fields = msgspec.structs.asdict(handshake())
    del fields["tp_size"]
    assert decode_handshake(msgspec.msgpack.encode(fields)).tp_size == 1


def test_handshake_of_another_version_is_refused_before_decoding():
    data = msgspec.msgpack.encode({"version": 99, "something": "else"})
    with pytest.raises(IncompatiblePeer, match="version 99"):
        decode_handshake(data)
    with pytest.raises(IncompatiblePeer, match="unreadable"):
        decode_handshake(b"\xc1garbage")


def test_transfer_params_round_trip_through_json():
    rp = RemotePrefill("p0", "req-1", "127.0.0.1", 5600, [[0, 3], [2, 4]], 300, 60.0,
                      checkpoints=[CheckpointRef(0, 9, 256)])
    params = msgspec.json.decode(msgspec.json.encode(rp.to_params()))
    assert params["do_remote_prefill"] is True and params["remote_block_ids"] == [[0, 3], [2, 4]]
    assert parse_remote_prefill({**params, "extra_from_proxy": 1}) == rp


def test_bad_transfer_params_are_named():
    with pytest.raises(BadTransferParams, match="protocol version None"):
        parse_remote_prefill({"do_remote_prefill": True, "remote_block_ids": [[1]]})
    with pytest.raises(BadTransferParams, match="malformed"):
        parse_remote_prefill({"hybrid_pd_version": PROTOCOL_VERSION, "remote_engine_id": "p"})


def test_notifications_round_trip_and_reject_garbage():
    assert decode_notification(encode(Done("r1"))) == Done("r1")
    assert decode_notification(encode(Rejected("r2", reason="aborted"))).reason == "aborted"
    with pytest.raises(ProtocolError):
        decode_notification(b"not msgpack at all \xc1")
    with pytest.raises(ProtocolError, match="version"):
        decode_notification(encode(Done("r1", version=7)))
