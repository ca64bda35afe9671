"""The KV integrity digest of a block, computed with torch where the bytes live (GPU or CPU), and the test hook
that corrupts landed blocks.

A block's digest covers the bytes that move for it: `t[b]` of every layer tensor of its KV-cache group, in the
group's layer order. Each layer's block is one dense byte range (vllm_kv_caches.block_is_dense), read in memory
order whatever the order of its inner dimensions, as 32-bit words w_i (bytes, for a block whose size is not a
multiple of 4), widened to int64 and reduced as sum_i m_i * w_i (mod 2**64, int64 arithmetic wraps), with m_i
a fixed pseudo-random odd 32-bit multiplier vector (the same seed on P and D, drawn on the CPU and copied to
the device, so both compute the same function). The layers' sums are then combined with one more odd
multiplier per layer. Why it catches what a transfer breaks:
- a flipped bit or byte changes one word by d (0 < |d| < 2**32): the digest moves by m_i * d, which is never
  0 mod 2**64 since m_i is odd (a product of an odd number and d is divisible by 2**64 only if d is);
- a zeroed block (a READ that never landed): its digest becomes 0, the original is 0 with chance ~2**-64
  unless the block was zero already (then nothing changed);
- two swapped blocks: digests are per block and compared per block id, so a block holding another block's
  bytes mismatches unless both held the same bytes; words swapped inside a block meet other multipliers.
Products are exact (a 32-bit word times a 32-bit multiplier fits in int64): an int32 product wrapping mod 2**32
would be twice as fast but blind to two top-bit flips (each moves its product by 2**31; together by 0 mod
2**32), e.g. the sign bits of two fp32 values. Not cryptographic: it guards against accidents (races, stale
or misplaced blocks), not against an adversary who can write P's memory. Cost: benchmarks/kv_digest_bench.py.

On a GPU one Triton kernel launch reads each block's words of every layer tensor of a call once and sums their
products in place (_layer_sums_triton); torch's path (the CPU's, and any layer whose blocks are not whole words)
gathers the blocks, widens and multiplies them in temporaries: 6-11 us/MB on attention pages, 16-32 on Mamba
states on an H100 (benchmarks/results/2026-11-26-h100-kv-digest, 2026-12-06-h100-nemotronh-judged-vllm033),
where a launch per layer took 2.3-27 us/MB (2026-12-07-h100-nemotronh-prefill-burst-vllm033: queued behind P's
step, they added ~1.1 ms to a P leg's answer) and one launch per call takes 0.18-0.41 ms a call up to 200 MB
(2026-12-07-h100-kv-digest-one-launch: 1.7-14x less than a call per layer). Both compute the same digests
(tests/connector/test_kv_digest.py runs the kernel in Triton's interpreter).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch

log = logging.getLogger("vllm." + __name__)  # under vLLM's configured logger
ALGORITHM = "mulsum-w32-i64-v2"  # v2: memory order (v1 read a permuted block in index order)
_SEED = 0x9E3779B97F4A7C15 & 0x7FFFFFFFFFFFFFFF
_multipliers: dict[tuple[int, str], torch.Tensor] = {}


def multipliers(n: int, device: torch.device) -> torch.Tensor:
    """The first `n` odd 32-bit multipliers, as int64 on `device` (cached: drawn once per length and device)."""
    key = (n, str(device))
    m = _multipliers.get(key)
    if m is None:
        gen = torch.Generator(device="cpu").manual_seed(_SEED)
        m = torch.randint(-(2**31), 2**31, (n,), generator=gen, dtype=torch.int64) | 1
        m = m.to(device)
        if m.device.type == "cuda":  # once: copied on the current stream, read on any (D checks on a stream of its own)
            torch.cuda.synchronize(m.device)
        _multipliers[key] = m
    return m


def _block_elements(t: torch.Tensor) -> int:
    return t[0].numel() if t.dim() > 1 else 1


def _raw(t: torch.Tensor) -> torch.Tensor:
    """(blocks, elements of one block) over t's memory in memory order: each block is one dense range."""
    return t.as_strided((t.shape[0], _block_elements(t)), (t.stride(0), 1))


def _words(blocks: torch.Tensor) -> torch.Tensor:
    """(k, n) blocks (rows of _raw) -> (k, words) int64: 32-bit words where the block's bytes allow, else bytes."""
    raw = blocks.contiguous()
    as_bytes = raw.view(torch.uint8) if raw.element_size() != 1 else raw
    if as_bytes.shape[1] % 4 == 0:
        return as_bytes.view(torch.int32).to(torch.int64)
    return as_bytes.to(torch.int64)


def digest_blocks(tensors: Sequence[torch.Tensor], block_ids: Sequence[int], batched: bool | None = None) -> list[int]:
    """The digest of each block in `block_ids` over `tensors` (one KV-cache group's layers, in a fixed order).
    `batched` (default: on a GPU) computes the same digests with the layers of one layout together
    (_layer_sums_batched)."""
    return PendingDigests([(tensors, block_ids)], batched).result()[0]


class PendingDigests:
    """The digests of (tensors, block_ids) jobs, queued where the tensors live and read back together: on a GPU
    the kernels of every job follow the work already queued on the current stream (the step's forward pass) and
    their values come up by an asynchronous copy, so nothing here makes the host wait; `result()` waits only if
    they are not there yet (`ready()` says whether it would). Before, each group of each request was read on
    its own, the block ids' pageable copy and the read each syncing the stream: 12 syncs for one prompt of the
    Nemotron-H shape's six groups, inside the step that completed it. On the CPU the values are computed at once."""

    def __init__(
        self,
        jobs: Sequence[tuple[Sequence[torch.Tensor], Sequence[int]]],
        batched: bool | None = None,
        stream: torch.cuda.Stream | None = None,
    ):
        """`stream`: queue them there instead (D's check of landed blocks, which no kernel of the step writes: they
        run beside the step's forward pass, not behind it)."""
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            parts = [_digest_tensor(t, ids, batched) if len(ids) and len(t) else None for t, ids in jobs]
            self._shape = [(x is not None, len(ids)) for x, (_, ids) in zip(parts, jobs)]
            live = [x for x in parts if x is not None]
            flat = torch.cat(live) if live else torch.zeros(0, dtype=torch.int64)
            self._event: torch.cuda.Event | None = None  # `flat` may go: its memory is reused in stream order
            if flat.device.type == "cuda":
                self._host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
                self._host.copy_(flat, non_blocking=True)
                self._event = torch.cuda.Event()
                self._event.record()
            else:
                self._host = flat
        self._values: list[list[int]] | None = None

    def ready(self) -> bool:
        return self._event is None or bool(self._event.query())

    def result(self) -> list[list[int]]:
        if self._values is None:
            if self._event is not None:
                self._event.synchronize()
            values = iter(self._host.tolist())
            self._values = [[next(values) for _ in range(n)] if live else [0] * n for live, n in self._shape]
            self._event = None
        return self._values


def _digest_tensor(tensors: Sequence[torch.Tensor], block_ids: Sequence[int], batched: bool | None) -> torch.Tensor:
    """The (k,) digests on the tensors' device, queued: no host sync (the block ids go up without one)."""
    device = tensors[0].device
    ids = torch.tensor(list(block_ids), dtype=torch.long)
    if device.type != "cpu":  # from pinned memory: an asynchronous copy, where a pageable one syncs the stream
        ids = ids.pin_memory().to(device, non_blocking=True)
    sums: dict[int, torch.Tensor] = _layer_sums_triton(tensors, ids) if device.type == "cuda" and _TRITON_OK else {}
    rest = [j for j in range(len(tensors)) if j not in sums]
    if rest and (device.type != "cpu" if batched is None else batched):
        sums.update(zip(rest, _layer_sums_batched([tensors[j] for j in rest], ids), strict=True))
    else:
        for j in rest:
            words = _words(_raw(tensors[j]).index_select(0, ids))
            # in place: a second int64 temporary of twice the block's size costs more than the product (page faults)
            sums[j] = words.mul_(multipliers(words.shape[1], device)).sum(dim=1)
    layers = torch.stack([sums[j] for j in range(len(tensors))], dim=1)  # (k, layers)
    return (layers * multipliers(layers.shape[1] + 1, device)[1:]).sum(dim=1)


# On a GPU the per-layer digest is bound by kernel launches, four per layer tensor (an H100: ~50 us per layer, 1.7 ms
# for one block of 36 GDN layers; benchmarks/results/2026-11-26-h100-kv-digest). Batched, each layer's blocks are
# gathered into one buffer and the layers of one layout are widened, multiplied and summed together, in slices of
# at most BATCH_BYTES of int64 words (a transient allocation beside vLLM's KV cache).
BATCH_BYTES = 64 << 20


def _layer_sums_batched(tensors: Sequence[torch.Tensor], ids: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the (k,) sums the per-layer path computes, exactly (integer arithmetic: the order is free)."""
    k, device = ids.shape[0], tensors[0].device
    out: dict[int, torch.Tensor] = {}
    raws = [_raw(t) for t in tensors]
    layouts: dict[tuple[int, torch.dtype], list[int]] = {}
    for j, r in enumerate(raws):
        layouts.setdefault((r.shape[1], r.dtype), []).append(j)
    for (elements, dtype), layers in layouts.items():
        size = elements * dtype.itemsize  # bytes of one block of one layer
        # as _words reads a block: 32-bit words, else bytes (a 1-byte type's own values)
        word = torch.int32 if size % 4 == 0 else (dtype if dtype.itemsize == 1 else torch.uint8)
        width = size // word.itemsize
        m = multipliers(width, device)
        per = max(1, BATCH_BYTES // (k * width * 8))
        for s in range(0, len(layers), per):
            part = layers[s : s + per]
            buf = torch.empty((len(part), k, size), dtype=torch.uint8, device=device)
            for i, j in enumerate(part):
                torch.index_select(raws[j], 0, ids, out=buf[i].view(dtype).view(k, elements))
            sums = buf.view(word).to(torch.int64).mul_(m).sum(dim=2)  # (layers of this slice, k)
            out.update(zip(part, sums, strict=True))
    return [out[j] for j in range(len(tensors))]


# The Triton kernel: one launch for every layer of a call, one program per (block, layer, WORDS words of it);
# _TRITON_OK goes False where it fails (torch then)
WORDS = 2048
_TRITON_OK = True
_kernels: dict[str | None, Any] = {}
_tables: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]] = {}  # per set of layers, _layer_table


def triton_kernel() -> Any:
    """The digest kernel (built at first use; again when TRITON_INTERPRET changes: the tests run it on the CPU)."""
    mode = os.environ.get("TRITON_INTERPRET")
    if mode not in _kernels:
        import triton
        import triton.language as tl

        @triton.jit
        def digest_words(  # type: ignore[no-untyped-def]
            ptrs, strides, sizes, ids_ptr, m_ptr, out_ptr, k, WORDS: tl.constexpr
        ):
            layer, chunk = tl.program_id(1), tl.program_id(2)
            n_words = tl.load(sizes + layer)
            if chunk * WORDS < n_words:  # a layer of fewer words than the largest: its last programs do nothing
                block = tl.load(ids_ptr + tl.program_id(0))
                offs = chunk * WORDS + tl.arange(0, WORDS)
                inside = offs < n_words
                words = tl.load(ptrs + layer).to(tl.pointer_type(tl.int32))  # the layer's bytes as 32-bit words
                start = words + block * tl.load(strides + layer)
                w = tl.load(start + offs, mask=inside, other=0).to(tl.int64)
                m = tl.load(m_ptr + offs, mask=inside, other=0)
                # int64: wraps mod 2**64, in any order
                tl.atomic_add(out_ptr + layer * k + tl.program_id(0), tl.sum(w * m, axis=0))

        _kernels[mode] = digest_words
    return _kernels[mode]


def _layer_table(
    tensors: Sequence[torch.Tensor], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """(addresses, block strides in words, block sizes in words) of `tensors` on `device`, and the largest size,
    built once per set of layers (the KV caches live as long as the engine): no copy up, and no stream sync, per
    call."""
    rows = [
        (t.data_ptr(), t.stride(0) * t.element_size() // 4, _block_elements(t) * t.element_size() // 4) for t in tensors
    ]
    key = (str(device), *rows)
    table = _tables.get(key)
    if table is None:
        if len(_tables) >= 64:  # tensors come and go (tests): a handful of layer sets per engine
            _tables.clear()
        host = torch.tensor(list(zip(*rows)), dtype=torch.int64)
        on_device = host.to(device)  # once, at the kernel's warm-up (a pageable copy: it syncs the stream)
        table = _tables[key] = (on_device[0], on_device[1], on_device[2], max(r[2] for r in rows))
    return table


def _layer_sums_triton(tensors: Sequence[torch.Tensor], ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Per layer whose blocks are whole aligned words, the (k,) sums torch's paths compute, every such layer in
    one kernel launch (the Nemotron-H shape's state, 9 layers of 2.1 MB blocks: 0.22 ms a call on an H100, where
    a call per layer took 1.48 ms); {} (and torch from then on, with a
    warning) where Triton fails."""
    global _TRITON_OK
    words_ok = [
        j
        for j, t in enumerate(tensors)
        if _block_elements(t) * t.element_size() % 4 == 0
        and t.stride(0) * t.element_size() % 4 == 0
        and t.data_ptr() % 4 == 0
    ]
    if not words_ok:
        return {}
    try:
        import triton

        kernel = triton_kernel()
        k = ids.shape[0]
        ptrs, strides, sizes, most = _layer_table([tensors[j] for j in words_ok], ids.device)
        out = torch.zeros((len(words_ok), k), dtype=torch.int64, device=ids.device)
        grid = (k, len(words_ok), triton.cdiv(most, WORDS))
        kernel[grid](ptrs, strides, sizes, ids, multipliers(most, ids.device), out, k, WORDS=WORDS)
    except Exception as e:  # noqa: BLE001  never without digests: torch's path computes the same
        _TRITON_OK = False
        log.warning("KV digests: the Triton kernel failed (%s); torch computes them from now on", e)
        return {}
    return {j: out[i] for i, j in enumerate(words_ok)}


def flip_first_word(tensors: Sequence[torch.Tensor], block_id: int) -> None:
    """Test hook: flip the low byte of the first element of `block_id` in the first layer tensor."""
    t = tensors[0][block_id]
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    t.view(ints)[(0,) * t.dim()].bitwise_xor_(0xFF)
