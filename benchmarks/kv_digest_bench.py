"""KV integrity digest cost on this machine's CPU or GPU: microseconds per MB for block layouts of the tiny test
model and of Qwen3-Next-sized pages, per layer (the CPU's path), batched, and on a GPU the Triton kernel (what the
connector runs there, every layer of a call in one launch; also launched once per layer, as before; torch's two
paths timed with it off), next to a plain gather of the same bytes (index_select).

    bash deploy/dev.sh run python -m benchmarks.kv_digest_bench [--reps 20] [--out DIR]
    python3 -m benchmarks.kv_digest_bench --device cuda    # on a GPU machine (torch alone; the connector runs it
                                                           # on the device where vLLM's KV cache lives)

Each case digests `blocks` blocks of `layers` layer tensors the way the connector does on P (after the
prompt's last step) and on D (after the READ lands): connector/kv_digest.digest_blocks, one call per KV-cache
group, best and median of `reps` calls after one warm-up. Writes DIR/results.json and prints a table; the
reading (which default, what a PD turn costs) is in DIR/summary.md. It first checks, per case, that the batched,
per-layer and Triton digests are the same, on this device and against the CPU's (P and D may differ), and exits
if not.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

import hybrid_pd.connector.kv_digest as kv_digest
from hybrid_pd.connector.kv_digest import digest_blocks
from tests.support.tiny_layout import ATTN_LAYERS, MAMBA_LAYERS, PAGE, STATE

MB = 1e6


def cases(device: str = "cpu") -> dict[str, tuple[list[torch.Tensor], list[int]]]:
    """name -> (one group's layer tensors on `device`, the block ids to digest)."""
    out = {}
    # the tiny model (tests/support/tiny_layout.py): fp32 attention pages, GDN states smaller than their page
    attn = [torch.randn(16, PAGE // 4) for _ in range(ATTN_LAYERS)]
    out["tiny attention: 2 blocks x 2 layers x 128 KiB"] = (attn, [3, 4])
    pages = [torch.randn(16, PAGE // 4) for _ in range(MAMBA_LAYERS)]
    states = [p.as_strided((16, STATE // 4), (PAGE // 4, 1)) for p in pages]
    out["tiny GDN state: 1 block x 2 layers x 67 KiB"] = (states, [5])
    # Qwen3-Next-80B-sized pages (bf16): an attention page of ~1.1 MB per layer and block (544 tokens, K+V,
    # 2 KV heads x 256), a GDN state of ~1 MB per layer; many layers, few blocks per turn
    big = [torch.randn(16, 544 * 2 * 2 * 256).to(torch.bfloat16) for _ in range(12)]
    out["Qwen3-Next-sized attention: 4 blocks x 12 layers x 1.1 MB"] = (big, [1, 2, 3, 4])
    gdn = [torch.randn(4, 2**19).to(torch.bfloat16) for _ in range(36)]
    out["Qwen3-Next-sized GDN state: 1 block x 36 layers x 1 MB"] = (gdn, [2])
    # a whole PD turn's attention at 8k tokens: 15 blocks of 544 tokens
    out["Qwen3-Next-sized attention: 15 blocks x 12 layers x 1.1 MB"] = (big, list(range(1, 16)))
    # Nemotron-H-8B-sized Mamba2 states (benchmarks/gpu/real_shapes.py nemotronh, 9 Mamba2 layers): 128 heads x 64
    # x state 128 plus the convolution's 3 x 10,240 (bf16), ~2.1 MB per layer; P at N-1 ships two per layer
    mamba2 = [torch.randn(4, 128 * 64 * 128 + 3 * 10240).to(torch.bfloat16) for _ in range(9)]
    out["Nemotron-H-sized Mamba2 state: 2 blocks x 9 layers x 2.1 MB"] = (mamba2, [1, 3])
    return {name: ([t.to(device) for t in tensors], ids) for name, (tensors, ids) in out.items()}


def nbytes(tensors: list[torch.Tensor], ids: list[int]) -> int:
    return sum(t[0].numel() * t.element_size() for t in tensors) * len(ids)


def timed(fn, reps: int, sync=lambda: None) -> list[float]:
    """Seconds per call of `fn`, after one warm-up call; `sync` waits for the device's queued work (CUDA runs
    kernels asynchronously: the digest's .tolist() syncs by itself, a gather does not)."""
    fn()
    sync()
    out = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - start)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine")
    args = ap.parse_args()
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    rows = []
    for name, (tensors, ids) in cases(args.device).items():
        size = nbytes(tensors, ids)
        index = torch.tensor(ids, device=args.device)
        kv_digest._TRITON_OK = False  # torch's paths first
        on_cpu = digest_blocks([t.cpu() for t in tensors], ids, batched=False)
        if not digest_blocks(tensors, ids, batched=True) == digest_blocks(tensors, ids, batched=False) == on_cpu:
            raise SystemExit(f"{name}: the batched and per-layer digests differ, or differ from the CPU's")
        digest = timed(lambda: digest_blocks(tensors, ids, batched=False), args.reps, sync)  # noqa: B023
        batched = timed(lambda: digest_blocks(tensors, ids, batched=True), args.reps, sync)  # noqa: B023
        kv_digest._TRITON_OK = True
        triton = apart = [float("nan")]
        if args.device.startswith("cuda"):
            if digest_blocks(tensors, ids) != on_cpu or not kv_digest._TRITON_OK:
                raise SystemExit(f"{name}: the Triton kernel's digests differ from the CPU's, or it failed")
            triton = timed(lambda: digest_blocks(tensors, ids), args.reps, sync)  # noqa: B023
            # a call per layer tensor (its own table, launch and read-back), as before one launch took them all
            apart = timed(lambda: [digest_blocks([t], ids) for t in tensors], args.reps, sync)  # noqa: B023
        copy = timed(lambda: [t.index_select(0, index) for t in tensors], args.reps, sync)  # noqa: B023
        rows.append({
            "case": name, "bytes": size,
            "digest_us_per_mb_best": min(digest) * 1e6 / (size / MB),
            "digest_us_per_mb_median": statistics.median(digest) * 1e6 / (size / MB),
            "copy_us_per_mb_best": min(copy) * 1e6 / (size / MB),
            "digest_ms_median": statistics.median(digest) * 1e3,
            "batched_us_per_mb_best": min(batched) * 1e6 / (size / MB),
            "batched_ms_median": statistics.median(batched) * 1e3,
            "triton_us_per_mb_best": min(triton) * 1e6 / (size / MB),
            "triton_ms_median": statistics.median(triton) * 1e3,
            "triton_per_layer_ms_median": statistics.median(apart) * 1e3,
        })
    meta = {"machine": platform.processor() or platform.machine(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "reps": args.reps, "device": args.device}
    if args.device.startswith("cuda"):
        meta["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(meta))
    print(f"{'case':58} {'MB':>6} {'digest us/MB best':>18} {'median':>8} {'copy us/MB':>11} {'ms/call':>8} "
          f"{'batched us/MB':>14} {'ms/call':>8} {'triton us/MB':>13} {'ms/call':>8} {'a launch per layer, ms':>22}")
    for r in rows:
        print(f"{r['case']:58} {r['bytes'] / MB:6.2f} {r['digest_us_per_mb_best']:18.0f} "
              f"{r['digest_us_per_mb_median']:8.0f} {r['copy_us_per_mb_best']:11.0f} {r['digest_ms_median']:8.2f} "
              f"{r['batched_us_per_mb_best']:14.0f} {r['batched_ms_median']:8.2f} "
              f"{r['triton_us_per_mb_best']:13.1f} {r['triton_ms_median']:8.2f} "
              f"{r['triton_per_layer_ms_median']:22.2f}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
