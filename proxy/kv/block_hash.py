"""vLLM's prefix-cache block hashes, reproduced bit for bit without importing vLLM.

vLLM (v1/core/kv_cache_utils.py, 0.26-0.32) hashes a request's tokens in chunks of `hash_block_size`,
chained over the whole prefix:

    NONE_HASH = H(seed)                         seed = $PYTHONHASHSEED or "vllm-none-hash"
    h_1 = H((NONE_HASH, tuple(t[0:h]),  extra_1))
    h_i = H((h_{i-1},   tuple(t[(i-1)h:ih]), extra_i))

    H = sha256(pickle.dumps(x, protocol=HIGHEST_PROTOCOL))    --prefix-caching-hash-algo sha256 (default)
      | sha256(cbor2.dumps(x, canonical=True))                 sha256_cbor

`extra_i` is None for plain text requests; a `cache_salt` adds (("cache_salt", salt),) to block 1 only.
(LoRA, multimodal and prompt-embeds requests add more keys; the proxy does not score those and returns no
hashes for them.) Because every h_i fingerprints the whole prefix of i*h tokens, a KV-cache group of block size
B = k*h publishes h_{jk} for its j-th block: one list of chained hashes serves every group.
The xxhash algorithms use a random per-process seed, so nobody outside the worker can reproduce them.
"""

from __future__ import annotations

import hashlib
import pickle
import struct
from collections.abc import Callable, Sequence
from typing import Any

from hybrid_pd.connector.contract import DEFAULT_NONE_HASH_SEED

HashFn = Callable[[Any], bytes]


def sha256_pickle(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor_canonical(obj)).digest()


HASH_FUNCTIONS: dict[str, HashFn] = {"sha256": sha256_pickle, "sha256_cbor": sha256_cbor}


def none_hash(algo: str, seed: str) -> bytes:
    return HASH_FUNCTIONS[algo](seed)


def chained_block_hashes(
    token_ids: Sequence[int],
    hash_block_size: int,
    algo: str = "sha256",
    seed: str = DEFAULT_NONE_HASH_SEED,
    cache_salt: str | None = None,
) -> list[bytes]:
    """Hashes of every full `hash_block_size` chunk of `token_ids`, as vLLM's request block hasher computes
    them (a trailing partial chunk is not hashed)."""
    tokens, h = tuple(token_ids), hash_block_size
    return extend_chain(none_hash(algo, seed), tokens, h, 0, len(tokens) // h, algo, cache_salt)


def extend_chain(
    parent: bytes, tokens: tuple[int, ...], h: int, first: int, last: int, algo: str, cache_salt: str | None = None
) -> list[bytes]:
    """The chained hashes of blocks [first, last) of `tokens` at granularity h, `parent` being block first-1's
    (NONE_HASH for block 0). The default algorithm is inlined: this is the proxy's hot path (one pickle and one
    sha256 per block, as vLLM's own hasher does; nothing cheaper gives the same bytes)."""
    out: list[bytes] = []
    if first == 0 and cache_salt and last > 0:
        parent = HASH_FUNCTIONS[algo]((parent, tokens[:h], (("cache_salt", cache_salt),)))
        out.append(parent)
        first = 1
    if algo == "sha256":
        dumps, sha, proto, append = pickle.dumps, hashlib.sha256, pickle.HIGHEST_PROTOCOL, out.append
        for start in range(first * h, last * h, h):
            parent = sha(dumps((parent, tokens[start : start + h], None), proto)).digest()
            append(parent)
        return out
    fn = HASH_FUNCTIONS[algo]
    for start in range(first * h, last * h, h):
        parent = fn((parent, tokens[start : start + h], None))
        out.append(parent)
    return out


def as_int_hash(h: bytes) -> int:
    """The form vLLM publishes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (low 64 bits, big endian)."""
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


# The routing index keys a block by the low 60 bits of its hash: what a worker publishing ints sends (the low 64)
# and what one publishing sha256 bytes sends map to the same key, and a 60-bit int is a two-digit Python int.
# Two blocks share a key with odds 2^-60 per pair: routing is a hint, such a clash costs a recompute at worst.
KEY_MASK = (1 << 60) - 1


def block_key(h: bytes | int) -> int:
    """The index key of a published block hash (sha256 bytes or vLLM's int form)."""
    return (h if isinstance(h, int) else int.from_bytes(h[-8:], "big")) & KEY_MASK


_LOW64 = struct.Struct(">24xQ").unpack  # a sha256 digest's low 64 bits, big endian


def keys_of(hashes: Sequence[bytes | int]) -> list[int]:
    """block_key of many published hashes (sha256 digests the fast way: one precompiled unpack each)."""
    try:
        return [_LOW64(h)[0] & KEY_MASK for h in hashes]  # type: ignore[arg-type]
    except (struct.error, TypeError):  # an int, or bytes of another length
        return [block_key(h) for h in hashes]


# ---- canonical CBOR (RFC 8949 section 4.2.1), enough for the hashed tuples -------------------------------
def cbor_canonical(obj: Any) -> bytes:
    out = bytearray()
    _cbor(obj, out)
    return bytes(out)


def _head(major: int, n: int, out: bytearray) -> None:
    if n < 24:
        out.append(major << 5 | n)
    elif n < 1 << 8:
        out += bytes((major << 5 | 24, n))
    elif n < 1 << 16:
        out.append(major << 5 | 25)
        out += struct.pack(">H", n)
    elif n < 1 << 32:
        out.append(major << 5 | 26)
        out += struct.pack(">I", n)
    elif n < 1 << 64:
        out.append(major << 5 | 27)
        out += struct.pack(">Q", n)
    else:
        raise ValueError("integer too large for the hashed CBOR subset")


def _cbor(obj: Any, out: bytearray) -> None:
    if obj is None:
        out.append(0xF6)
    elif obj is True or obj is False:
        out.append(0xF5 if obj else 0xF4)
    elif isinstance(obj, int):
        _head(0, obj, out) if obj >= 0 else _head(1, -1 - obj, out)
    elif isinstance(obj, (bytes, bytearray)):
        _head(2, len(obj), out)
        out += obj
    elif isinstance(obj, str):
        data = obj.encode("utf-8")
        _head(3, len(data), out)
        out += data
    elif isinstance(obj, (tuple, list)):
        _head(4, len(obj), out)
        for item in obj:
            _cbor(item, out)
    else:
        raise TypeError(f"cannot CBOR-encode {type(obj).__name__} in a block hash")
