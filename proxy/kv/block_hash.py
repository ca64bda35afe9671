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

HashFn = Callable[[Any], bytes]
# NONE_HASH's seed when the workers set no PYTHONHASHSEED (vllm/v1/core/kv_cache_utils.py DEFAULT_NONE_HASH_SEED)
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
# vLLM < 0.27 derives NONE_HASH from os.urandom unless PYTHONHASHSEED is set: workers and the proxy could never
# agree on block hashes. The launchers then set this seed (prefill/worker_config.py), and the proxy tries it too.
LAUNCHER_HASH_SEED = "0"


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
    seed: str = "vllm-none-hash",
    cache_salt: str | None = None,
) -> list[bytes]:
    """Hashes of every full `hash_block_size` chunk of `token_ids`, as vLLM's request block hasher computes
    them (a trailing partial chunk is not hashed)."""
    fn = HASH_FUNCTIONS[algo]
    parent = none_hash(algo, seed)
    out: list[bytes] = []
    for start in range(0, len(token_ids) - hash_block_size + 1, hash_block_size):
        extra = (("cache_salt", cache_salt),) if (start == 0 and cache_salt) else None
        parent = fn((parent, tuple(token_ids[start : start + hash_block_size]), extra))
        out.append(parent)
    return out


def as_int_hash(h: bytes) -> int:
    """The form vLLM publishes with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 (low 64 bits, big endian)."""
    return int.from_bytes(h, "big") & ((1 << 64) - 1)


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
