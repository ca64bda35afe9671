"""summary.md for the KV-index benchmark (kv_index_bench.py) from the results files in its --out folder:
results.json (16-64 sessions of 8k tokens per worker) and results-<N>.json (N attention blocks per worker)."""

from __future__ import annotations

import json
from pathlib import Path

TARGET_MS, TARGET_EVENTS, TARGET_SHARED, TARGET_UNSHARED = 0.5, 1e6, 24, 48


def _ms(d: dict, kind: str, q: str) -> str:
    v = d.get(f"{kind}_ms", {}).get(q)
    return f"{v:.3f}" if v is not None else "-"


def _rate(row: dict, key: str) -> str:
    v = row.get(key)
    return f"{v / 1e6:.2f}M" if v else "-"


def _num(v: float | None, fmt: str = ".1f") -> str:
    return format(v, fmt) if v is not None else "-"


def section(results: dict) -> list[str]:
    meta, rows = results["meta"], results["rows"]
    out = [f"Command: `{meta['command']}`", "",
           f"Machine: {meta['machine']}; commit {meta['commit']}; {meta['date']}.",
           "", "CPU time of the routing decision (ms; this thread's CPU, GC off while timed), hashing included. "
           "before = per-worker sets, every worker walked; after cold = the proxy's chain cache empty; after warm = "
           "the session's previous turn went through the proxy (only the new 512 tokens are hashed).", ""]
    for probe, title in (("continuation", "8.7k-token probe continuing a session one worker holds"),
                         ("new_session", "8.7k-token new session (only the 2k system prompt is held anywhere)")):
        out += [f"**{title}**", "",
                "| workers | before p50 | before p99 | after cold p50 | after cold p99 | after warm p50 "
                "| after warm p99 |",
                "|---|---|---|---|---|---|---|"]
        for r in rows:
            d = r["decisions"][probe]
            out.append(f"| {r['workers']} | {_ms(d, 'before', 'p50')} | {_ms(d, 'before', 'p99')} | "
                       f"{_ms(d, 'after_cold', 'p50')} | {_ms(d, 'after_cold', 'p99')} | "
                       f"{_ms(d, 'after_warm', 'p50')} | {_ms(d, 'after_warm', 'p99')} |")
        out.append("")
    out += ["**Events** (block hashes per CPU second, one core; start-up = every worker's whole cache announced into "
            "an empty index, stores/s over it; removals = worker 0's cache evicted from the full index; "
            "decode+apply = four workers' msgpack frames decoded and applied to an empty index, a smaller one)", "",
            "| workers | (block, group, worker) entries | start-up before s | start-up after s | stores/s before | "
            "stores/s after | removals/s before | removals/s after | decode+apply/s before | decode+apply/s after |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['workers']} | {r['entries']:,} | {_num(r.get('startup_before_s'), '.2f')} | "
                   f"{r['startup_after_s']:.2f} | {_rate(r, 'ingest_before_per_s')} | "
                   f"{_rate(r, 'ingest_after_per_s')} | "
                   f"{_rate(r, 'remove_before_per_s')} | {_rate(r, 'remove_after_per_s')} | "
                   f"{_rate(r, 'decode_apply_before_per_s')} | {_rate(r, 'decode_apply_after_per_s')} |")
    if any("bytes_per_entry" in r for r in rows):
        out += ["", "**Memory**, bytes per (block, group, worker) entry (tracemalloc, what the index holds): this "
                "fleet; every worker holding its own 4,096 blocks (unshared); every worker holding the same 4,096 "
                "(shared)", "",
                "| workers | fleet before | fleet after | unshared before | unshared after | shared before | "
                "shared after |", "|---|---|---|---|---|---|---|"]
        for r in rows:
            m = r.get("bytes_per_entry", {})
            out.append(f"| {r['workers']} | {_num(m.get('fleet_before'))} | {_num(m.get('fleet_after'))} | "
                       f"{_num(m.get('unshared_before'))} | {_num(m.get('unshared_after'))} | "
                       f"{_num(m.get('shared_before'))} | {_num(m.get('shared_after'))} |")
    h = rows[-1]["hashing_ms"]
    out += ["", f"Hashing one 8.7k-token probe, all 544 blocks, no cache (ms): before {h['before']:.3f}, after "
            f"{h['after']:.3f}, vLLM's own hash_block_tokens loop {h.get('vllm', float('nan')):.3f}.", ""]
    return out


def targets(rows: list[dict]) -> list[str]:
    r = next((x for x in rows if x["workers"] == 256), None)
    if r is None:
        return []
    d = r["decisions"]["continuation"]
    m = r.get("bytes_per_entry", {})
    checks = [
        ("CPU per decision, 256 workers, 8.7k tokens, warm p50", d["after_warm_ms"]["p50"], "<=", TARGET_MS, "ms"),
        ("CPU per decision, 256 workers, 8.7k tokens, warm p99", d["after_warm_ms"]["p99"], "<=", TARGET_MS, "ms"),
        ("CPU per decision, 256 workers, 8.7k tokens, cold p50", d["after_cold_ms"]["p50"], "<=", TARGET_MS, "ms"),
        ("block events ingested per second per core", r["ingest_after_per_s"], ">=", TARGET_EVENTS, "/s"),
        ("bytes per (block, worker), shared", m.get("shared_after"), "<=", TARGET_SHARED, "B"),
        ("bytes per (block, worker), unshared", m.get("unshared_after"), "<=", TARGET_UNSHARED, "B"),
    ]
    out = ["| target | figure | met |", "|---|---|---|"]
    for name, v, op, limit, unit in checks:
        if v is None:
            continue
        ok = v <= limit if op == "<=" else v >= limit
        out.append(f"| {name} {op} {limit:g} {unit} | {v:,.3f} {unit} | {'yes' if ok else 'no'} |")
    return out


def write_summary(folder: Path) -> None:
    lines = ["# The proxy's KV routing index at fleet scale: before (per-worker sets) and after (block -> workers)",
             "", "Workload (benchmarks/kv_index_workload.py): attention blocks of 16 tokens, a Mamba checkpoint every "
             "256; every worker holds a shared 2k-token system prompt and 16-64 sessions of 8k tokens behind it (or "
             "as many as make N blocks per worker); probes of 8.7k tokens. Both indexes get the same events and "
             "must pick the same worker (asserted).", ""]
    main = folder / "results.json"
    if main.exists():
        results = json.loads(main.read_text())
        lines += ["## 16-64 sessions of 8k tokens per worker", ""] + section(results)
        lines += ["## Targets (256 workers)", ""] + targets(results["rows"]) + [""]
    for extra in sorted(folder.glob("results-*.json")):
        n = int(extra.stem.split("-")[1])
        lines += [f"## {n:,} attention blocks per worker", ""] + section(json.loads(extra.read_text()))
    notes = folder / "notes.md"
    if notes.exists():
        lines += [notes.read_text()]
    (folder / "summary.md").write_text("\n".join(lines).rstrip() + "\n")
