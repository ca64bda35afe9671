"""vLLM's KV-cache tensors as the transport sees them: one `Region` per layer tensor (a block is one contiguous byte
range of it), the memory ranges NIXL registers, and the block hooks the worker side calls (zeroing the blocks of a
failed READ; the test hooks that spoil landed bytes on purpose)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hybrid_pd.connector.errors import ConfigurationError
from hybrid_pd.connector.kv_digest import PendingDigests, flip_first_word
from hybrid_pd.connector.messages import Region


@dataclass
class KvCacheLayout:
    regions: list[Region] = field(default_factory=list)
    ranges: dict[int, int] = field(default_factory=dict)  # storage start -> bytes: what NIXL registers
    mem_type: str = "DRAM"
    by_group: dict[int, list[Any]] = field(default_factory=dict)  # KV-cache group -> its layers' tensors
    _side: Any = None  # the CUDA stream of D's checks (landed_digests), made at first use

    def clear_blocks(self, runs: Iterable[Any]) -> None:
        """Zero the blocks of `runs` (a failed READ's: nothing half-landed is ever read as cached)."""
        for run in runs:
            for t in self.by_group.get(run.group, ()):
                t[run.local_start : run.local_start + run.count].zero_()

    def digests(self, items: Sequence[tuple[int, Sequence[int]]]) -> PendingDigests:
        """Per (group, block ids): their digests over every tensor of that group, queued and read back together
        (kv_digest.PendingDigests), behind the work on the current stream (P: the forward pass that wrote them)."""
        return PendingDigests([(self.by_group.get(group, ()), ids) for group, ids in items])

    def landed_digests(self, items: Sequence[tuple[int, Sequence[int]]]) -> PendingDigests:
        """The same for blocks a READ landed (D's check), on a GPU on a stream of their own: no kernel of D's
        steps writes them, so they need not wait for the forward pass queued ahead of them."""
        return PendingDigests([(self.by_group.get(group, ()), ids) for group, ids in items], stream=self.side_stream())

    def warm_digests(self) -> None:
        """At start-up: digest block 0 of every group on both streams, so that a GPU compiles the digest kernels
        (kv_digest.triton_kernel: one per layer dtype) now, not in the step of the first request that needs them."""
        items = [(group, [0]) for group in self.by_group]
        self.digests(items).result()
        self.landed_digests(items).result()

    def side_stream(self) -> Any:
        """The CUDA stream of D's checks (None on a CPU), made at first use."""
        if self._side is None and self.mem_type == "VRAM":
            import torch

            device = next(t.device for layers in self.by_group.values() for t in layers)
            self._side = torch.cuda.Stream(device)
        return self._side

    def corrupter(self, kind: str, group_kinds: list[str]) -> Callable[[Iterable[Any]], None]:
        """The test hooks HYBRID_PD_TEST_CORRUPT_READS and _KIND: "flip" flips the first word of each landed run's
        first block; "zero-state" zeroes every landed Mamba block (the state D resumes from is all zeros);
        "scramble-attention" overwrites the last landed block of each attention group (the one nearest the
        boundary: runs come in the request's block order) with noise four times its own largest magnitude, in
        every layer of the group, the state untouched."""

        def corrupt(runs: Iterable[Any]) -> None:
            last: dict[int, int] = {}
            for run in runs:
                if kind == "flip":
                    flip_first_word(self.by_group[run.group], run.local_start)
                elif kind == "zero-state" and group_kinds[run.group] == "mamba":
                    for t in self.by_group[run.group]:
                        t[run.local_start : run.local_start + run.count].zero_()
                elif kind == "scramble-attention" and group_kinds[run.group] == "attention":
                    last[run.group] = run.local_start + run.count - 1
            for group, block in last.items():
                for layer, t in enumerate(self.by_group[group]):
                    scramble_block(t, block, seed=layer)
            if (side := self.side_stream()) is not None:  # the check that follows reads the spoiled bytes
                import torch

                side.wait_stream(torch.cuda.current_stream(side.device))

        return corrupt


def scramble_block(t: Any, block: int, seed: int) -> None:
    """Test hook: block `block` of tensor `t` becomes seeded Gaussian noise scaled to 4x the block's largest
    magnitude (so that attention over it reads neither its keys nor its values)."""
    import torch

    scale = 4.0 * max(float(t[block].abs().max()), 1.0)
    gen = torch.Generator(device=t.device).manual_seed(seed)
    noise = torch.randn(t[block].shape, generator=gen, device=t.device, dtype=torch.float32)
    t[block].copy_(noise * scale)


def kv_cache_layout(kv_caches: dict[str, Any], kv_cache_groups: list[Any]) -> KvCacheLayout:
    """The regions of every layer of `kv_cache_groups` in `kv_caches` (vLLM's register_kv_caches argument: a tensor,
    or a list of them, per layer), in layer-name order. A layer whose block is not one byte range is refused."""
    group_of = {name: i for i, g in enumerate(kv_cache_groups) for name in g.layer_names}
    out = KvCacheLayout()
    for layer in sorted(kv_caches):
        if layer not in group_of:
            continue
        tensors = kv_caches[layer] if isinstance(kv_caches[layer], (list, tuple)) else [kv_caches[layer]]
        for k, t in enumerate(tensors):
            if not block_is_dense(t):
                raise ConfigurationError(
                    f"layer {layer}: one block is not contiguous in memory "
                    f"(shape {tuple(t.shape)}, strides {t.stride()})"
                )
            name = layer if len(tensors) == 1 else f"{layer}#{k}"
            size = t.element_size()
            out.regions.append(
                Region(name, group_of[layer], t.data_ptr(), t.stride(0) * size, t[0].numel() * size, t.shape[0])
            )
            out.by_group.setdefault(group_of[layer], []).append(t)
            storage = t.untyped_storage()
            out.ranges[storage.data_ptr()] = storage.nbytes()
            out.mem_type = "DRAM" if t.device.type == "cpu" else "VRAM"
    return out


def block_is_dense(t: Any) -> bool:
    """One block (t[i]) fills one contiguous byte range, whatever the order of its inner dimensions: vLLM's
    GPU attention cache is (blocks, 2, block_size, heads*dim) with K/V interleaved per token (strides
    (20480, 128, 256, 1) on vLLM 0.26), which is not `is_contiguous()` yet moves as one range per block."""
    dims = sorted((t.stride(d), t.shape[d]) for d in range(1, t.dim()) if t.shape[d] != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return t.dim() == 1 or t.stride(0) >= expected
