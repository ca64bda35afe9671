"""Tables (markdown) and a plot of the fleet simulator's results: validation.json and fleet.json of one folder.

python -m benchmarks.fleetsim_report DIR     # writes DIR/tables.md and DIR/fleet.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _err(m: float, s: float) -> str:
    return f"{(s / m - 1) * 100:+.0f}%" if m else "-"


def validation_table(v: dict) -> list[str]:
    out = [
        "| run | prompt | c | n | TTFT p50 ms measured / sim (err) | TTFT p90 ms measured / sim (err) | "
        "hit rate measured / sim | D-local turns measured / sim |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in v["rows"]:
        (m50, s50), (m90, s90), (mh, sh) = r["ttft_p50_ms"], r["ttft_p90_ms"], r["hit_rate"]
        fitted = " (fit)" if r["fitted"] else ""
        out.append(
            f"| {r['run']} | {r['length']} | {r['c']}{fitted} | {r['requests']} "
            f"| {m50:.0f} / {s50:.0f} ({_err(m50, s50)}) "
            f"| {m90:.0f} / {s90:.0f} ({_err(m90, s90)}) | {mh:.3f} / {sh:.3f} ({_err(mh, sh)}) "
            f"| {r['d_local_turns'][0]} / {r['d_local_turns'][1]} |"
        )
    return out


def cost_table(v: dict) -> list[str]:
    out = [
        "| run | s0 ms | s1 us/token | s3 ms/request | d0 ms | d1 ms/request | READ GB/s | p_hop ms | "
        "read_poll ms | front ms | front_local ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in v["cost_models"].items():
        out.append(
            f"| {name} | {c['s0'] * 1e3:.1f} | {c['s1'] * 1e6:.1f} | {c['s3'] * 1e3:.0f} | {c['d0'] * 1e3:.2f} | "
            f"{c['d1'] * 1e3:.3f} | {c['read_bw'] / 1e9:.1f} | {c['p_hop'] * 1e3:.1f} | "
            f"{c['read_poll'] * 1e3:.1f} | {c['front'] * 1e3:.1f} | {c['front_local'] * 1e3:.1f} |"
        )
    return out


def fleet_table(f: dict) -> list[str]:
    out = [
        "| fleet | sessions/s per pair | policy | requests | goodput req/s | SLO met | TTFT p50 ms | TTFT p90 ms | "
        "hit rate (oracle) | prefilled on P | READ GB | sim CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in f["rows"]:
        out.append(
            f"| {r['pairs']}P{r['pairs']}D | {r['rate_per_pair']:g} | {r['policy']} | {r['requests']} | "
            f"{r['goodput_rps']:.1f} | {r['slo_met']:.3f} | {r['ttft_p50_ms']:.0f} | {r['ttft_p90_ms']:.0f} | "
            f"{r['hit_rate']:.3f} ({r['oracle_rate']:.3f}) | {r['remote_share']:.2f} | {r['read_gb']:.0f} | "
            f"{r['cpu_s']:.1f} |"
        )
    return out


def plot(f: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    sizes = sorted({r["pairs"] for r in f["rows"]})
    policies = list(dict.fromkeys(r["policy"] for r in f["rows"]))
    fig, axes = plt.subplots(2, len(sizes), figsize=(5 * len(sizes), 8), squeeze=False)
    for i, n in enumerate(sizes):
        for p in policies:
            rows = sorted(
                (r for r in f["rows"] if r["pairs"] == n and r["policy"] == p), key=lambda r: r["rate_per_pair"]
            )
            x = [r["rate_per_pair"] for r in rows]
            axes[0][i].plot(x, [r["goodput_rps"] for r in rows], marker="o", label=p)
            axes[1][i].plot(x, [r["hit_rate"] for r in rows], marker="o", label=p)
        axes[0][i].set_title(
            f"{n}P{n}D: goodput (TTFT <= {f['slo']['ttft_s']:g} s, TPOT <= {f['slo']['tpot_s'] * 1e3:g} ms)"
        )
        axes[1][i].set_title(f"{n}P{n}D: prefix hit rate (compute saved)")
        for ax in (axes[0][i], axes[1][i]):
            ax.set_xlabel("new sessions / s per P-D pair")
            ax.grid(alpha=0.3)
        axes[0][i].set_ylabel("requests / s within SLO")
        axes[1][i].set_ylabel("cached / prompt tokens")
    axes[0][0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main(folder: Path) -> None:
    v = json.loads((folder / "validation.json").read_text())
    f = json.loads((folder / "fleet.json").read_text())
    lines = [
        "## Validation: the GPU 1P1D runs, measured vs simulated",
        "",
        *validation_table(v),
        "",
        "## Cost models (fitted per run folder)",
        "",
        *cost_table(v),
        "",
        "## Fleet",
        "",
        *fleet_table(f),
        "",
    ]
    (folder / "tables.md").write_text("\n".join(lines))
    plot(f, folder / "fleet.png")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
