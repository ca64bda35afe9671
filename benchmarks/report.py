"""Benchmark report: a Markdown summary with ratios, and PNG plots, from results.json."""

from __future__ import annotations

import statistics
from pathlib import Path


def pct(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v is not None)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def summarize(run: dict) -> dict:
    rows = run["requests"]
    ttft = [r["ttft_s"] for r in rows]
    return {"ttft_p50_ms": pct(ttft, 0.5) * 1e3, "ttft_p90_ms": pct(ttft, 0.9) * 1e3,
            "itl_ms": statistics.fmean(r["itl_s"] for r in rows if r["itl_s"] is not None) * 1e3,
            "e2e_p50_ms": pct([r["e2e_s"] for r in rows], 0.5) * 1e3, "throughput": run["throughput_tok_s"],
            "hits": sum(r["hit_tokens"] for r in rows), "oracle": sum(r["oracle_hit"] for r in rows),
            "bytes": run["transfer"]["bytes"], "descriptors": run["transfer"]["descriptors"],
            "transfers": run["transfer"]["transfers"], "failed": run["transfer"]["failed_transfers"]}


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "-"


def write_report(results: dict, out: Path) -> None:
    sums = {name: summarize(run) for name, run in results["setups"].items()}
    lines = [f"# Benchmark: {', '.join(sums)}", "",
             f"Command: `{results['command']}`  ", f"Machine: {results['machine']}  ",
             f"Date: {results['date']}; aligned block {results['block']} tokens; {results['max_tokens']} output "
             f"tokens per request, {results.get('mode', 'one request at a time')}; hybrid-pd set-ups use the "
             f"`{results['connector']}` "
             "connector."
             + (f" Every worker ran with `{results['worker_args']}`." if results.get("worker_args") else ""),
             "",
             "| set-up | TTFT p50 ms | TTFT p90 ms | ITL ms | e2e p50 ms | tok/s | hit tokens / oracle | bytes moved "
             "| descriptors | transfers | failed |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in sums.items():
        lines.append(f"| {name} | {s['ttft_p50_ms']:.0f} | {s['ttft_p90_ms']:.0f} | {s['itl_ms']:.1f} | "
                     f"{s['e2e_p50_ms']:.0f} | {s['throughput']:.1f} | {s['hits']} / {s['oracle']} "
                     f"({ratio(s['hits'], s['oracle'])}) | {s['bytes']:.0f} | {s['descriptors']:.0f} | "
                     f"{s['transfers']:.0f} | {s['failed']:.0f} |")
    for base in ("colocated", "upstream"):
        if base not in sums:
            continue
        lines += ["", f"Ratios against {base} (TTFT p50, throughput, hit tokens, bytes):", ""]
        for name, s in sums.items():
            if name != base:
                b = sums[base]
                lines.append(f"- {name}: TTFT {ratio(s['ttft_p50_ms'], b['ttft_p50_ms'])}, throughput "
                             f"{ratio(s['throughput'], b['throughput'])}, hits {ratio(s['hits'], b['hits'])}, "
                             f"bytes {ratio(s['bytes'], b['bytes'])}")
    workloads = sorted({r["workload"] for run in results["setups"].values() for r in run["requests"]})
    lines += ["", "Hit tokens per workload (oracle in the last column):", "",
              "| workload | " + " | ".join(sums) + " | oracle |", "|---" * (len(sums) + 2) + "|"]
    for w in workloads:
        runs = list(results["setups"].values())
        cells = [str(sum(r["hit_tokens"] for r in run["requests"] if r["workload"] == w)) for run in runs]
        oracle = sum(r["oracle_hit"] for r in runs[0]["requests"] if r["workload"] == w)
        lines.append(f"| {w} | " + " | ".join(cells) + f" | {oracle} |")
    late = {n: [r["late_s"] for r in run["requests"] if "late_s" in r] for n, run in results["setups"].items()}
    if any(late.values()):
        lines += ["", "Open loop: how late each send went out after its due time (ms):", "",
                  "| set-up | sends | late p50 | late max |", "|---|---|---|---|"]
        lines += [f"| {n} | {len(v)} | {pct(v, 0.5) * 1e3:.1f} | {max(v) * 1e3:.1f} |" for n, v in late.items() if v]
    lines += ["", "Plots: ttft.png (TTFT per set-up), hits_per_request.png, bytes_per_request.png."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    plot(results, out)


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results["setups"])
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.boxplot([[r["ttft_s"] * 1e3 for r in results["setups"][n]["requests"] if r["ttft_s"]] for n in names])
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("Time to first token per request")
    fig.tight_layout()
    fig.savefig(out / "ttft.png", dpi=100)
    for key, label, fname, with_oracle in (("hit_tokens", "prefix-hit tokens", "hits_per_request.png", True),
                                           ("bytes", "bytes moved P->D", "bytes_per_request.png", False)):
        fig, ax = plt.subplots(figsize=(9, 4))
        for n in names:
            ax.plot([r.get(key, 0) for r in results["setups"][n]["requests"]], marker="o", ms=3, label=n)
        if with_oracle:
            first = next(iter(results["setups"].values()))["requests"]
            ax.plot([r["oracle_hit"] for r in first], "k--", label="oracle")
        ax.set_xlabel("request (arrival order)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=100)
    plt.close("all")
