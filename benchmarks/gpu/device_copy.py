"""The GPU benchmark's yardstick (bench.py): device-to-device copies of the byte counts its transfers moved,
timed on the decoder's GPU and, when P has a GPU of its own, from P's GPU to D's."""

from __future__ import annotations

import statistics
import time


def device_copy(byte_counts: list[tuple[int, int]], gpu: int = 0, peer: int | None = None) -> list[dict]:
    """Median time of a device-to-device copy of each (bytes, descriptors) on GPU `gpu`: one contiguous copy,
    and the same bytes in `descriptors` equal pieces through one batched copy (torch._foreach_copy_); with
    `peer`, also one copy from GPU `peer` to GPU `gpu` (what a READ by D from P's GPU moves)."""
    import torch

    torch.cuda.set_device(gpu)  # the timing events below are recorded on the current device's stream
    out = []
    for nbytes, ndesc in sorted(set(byte_counts)):
        if nbytes <= 0:
            continue
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=f"cuda:{gpu}")
        dst = torch.empty_like(src)
        pieces = max(1, ndesc)
        cut = nbytes // pieces
        srcs = [src[i * cut:(i + 1) * cut] for i in range(pieces)]
        dsts = [dst[i * cut:(i + 1) * cut] for i in range(pieces)]

        def timed(fn, reps=20):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(reps):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) / 1e3)
            return statistics.median(times)

        one = timed(lambda d=dst, s=src: d.copy_(s))
        many = timed(lambda d=dsts, s=srcs: torch._foreach_copy_(d, s))
        assert torch.equal(dst, src)
        row = {"bytes": nbytes, "descriptors": ndesc, "contiguous_s": one, "pieces_s": many,
               "contiguous_gb_s": nbytes / one / 1e9, "pieces_gb_s": nbytes / many / 1e9}
        if peer is not None and peer != gpu:
            far = src.to(f"cuda:{peer}")
            torch.cuda.synchronize(peer)
            across = timed_wall(lambda d=dst, s=far: d.copy_(s), (gpu, peer))
            assert torch.equal(dst, src)
            row |= {"peer_s": across, "peer_gb_s": nbytes / across / 1e9}
            del far
        out.append(row)
        del src, dst, srcs, dsts
    return out


def timed_wall(fn, gpus: tuple[int, ...], reps: int = 20) -> float:
    """Median wall time of `fn` until every GPU in `gpus` is idle (a copy between GPUs spans two devices'
    streams, so one device's events do not bound it)."""
    import torch

    def sync():
        for g in gpus:
            torch.cuda.synchronize(g)

    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
