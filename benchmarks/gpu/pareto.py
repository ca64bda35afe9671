"""The output tok/s per GPU against tok/s per user of every set-up of a merged GPU run (pareto.png), the curve the
field judges a PD system by (Dynamo's recipes plot it): one point per concurrency of the headline workload.

    tok/s per user = 1000 / the cell's ITL p50 (ms): what one stream receives once it decodes
    tok/s per GPU  = the cell's output tok/s / the GPUs the set-up held: 1 for the colocated engine and for P and D
                     sharing one GPU (--prefill-gpu = --decode-gpu), 2 for P and D on GPUs of their own

A point up and to the right of another is better on both; the points of one set-up are joined in concurrency order.
"""

from __future__ import annotations

from pathlib import Path

COLOCATED = "colocated"


def gpus(setup: str, args: dict | None) -> int:
    """GPUs a set-up held: P and D on two where the part's args put them apart, the colocated engine one."""
    if setup.startswith(COLOCATED) or not args:
        return 1
    return 1 if args.get("prefill_gpu", 0) == args.get("decode_gpu", 0) else 2


def points(res: dict, workload: str, length: int) -> dict[str, list[tuple[int, float, float]]]:
    """Per set-up, (concurrency, tok/s per user, tok/s per GPU) of each cell with an ITL, in concurrency order."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for t in sorted(res["tables"], key=lambda t: t["concurrency"]):
        if t["workload"] != workload or t["length"] != length or not t.get("itl_p50_ms") or not t.get("tok_s"):
            continue
        per_gpu = t["tok_s"] / gpus(t["setup"], res.get("args", {}).get(t["setup"]))
        out.setdefault(t["setup"], []).append((t["concurrency"], 1000.0 / t["itl_p50_ms"], per_gpu))
    return out


def plot(res: dict, out: Path, workload: str = "agentic", length: int = 8192) -> list[str]:
    """pareto.png (none where no cell has the numbers)."""
    curves = points(res, workload, length)
    if not curves:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    for setup, pts in sorted(curves.items()):
        ax.plot([p[1] for p in pts], [p[2] for p in pts], "o-", label=setup)
        for c, x, y in pts:
            ax.annotate(f"c={c}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("output tok/s per user (1000 / ITL p50 ms)")
    ax.set_ylabel("output tok/s per GPU")
    ax.set_title(f"{workload} {length // 1024}k: throughput per GPU against speed per user")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "pareto.png", dpi=90)
    plt.close(fig)
    return ["pareto.png"]
