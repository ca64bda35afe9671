"""Merge the parts written by bench.py (one device call per set-up) into results.json and summary.md.

    python3 benchmarks/gpu/merge.py RESULTS_DIR [--headline-length 8192] [--title TITLE]

summary.md is RESULTS_DIR/header.md (the narrative, if there is one) followed by the generated tables.

Ratios are hybrid-pd over its peer, measured in the same run (same model, same GPU kind, same workloads):
ttft_p50_vs_upstream_c1 and ttft_p50_vs_colocated_c1 on agentic at the headline length and concurrency 1;
throughput_vs_upstream on agentic at the headline length and the highest concurrency; dlocal_ttft_vs_colocated:
median over hybrid-pd's decoder-only turns (concurrency 1, no bytes moved, a prefix hit) of TTFT over the
colocated engine's TTFT for the same request; transfer_vs_device_copy: hybrid-pd's GB/s on requests of at least
the headline length over a device-to-device copy of the same bytes in the same call; equal_to_colocated: the
fraction of hybrid-pd's requests whose greedy text equals the colocated engine's. The judged ratios against the peers
(worst_vs_upstream, goodput against upstream and the best peer, the share of turns on D alone against a hindsight
oracle's, hybrid misroutes) and their SLO: benchmarks/gpu/judged.py.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

if __package__:  # imported: benchmarks.gpu.merge
    from . import pareto
    from .judged import basis_md, judged
    from .phases import ms, pd_tax, phase_row, prefill_vs_upstream, proxy_added
else:  # run as a script (python3 benchmarks/gpu/merge.py): its own folder is on sys.path
    import pareto  # type: ignore[no-redef]
    from judged import basis_md, judged  # type: ignore[no-redef]
    from phases import ms, pd_tax, phase_row, prefill_vs_upstream, proxy_added  # type: ignore[no-redef]

SETUPS = ("colocated", "upstream", "hybrid-pd-1p1d")


def pct(values, q):
    values = sorted(v for v in values if v is not None)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def key(row):  # the prompt's length too: runs with other seeds have other prompts under the same names
    return (row["workload"], row["length"], row["concurrency"], row["session"], row["turn"], row["prompt_tokens"])


def summarize(run: dict) -> dict:
    rows = run["rows"]
    t = run["transfer"]
    secs = t.get("transfer_seconds", 0.0)
    return {"n": len(rows), "ttft_p50_ms": ms(pct([r["ttft_s"] for r in rows], 0.5)),
            "ttft_p90_ms": ms(pct([r["ttft_s"] for r in rows], 0.9)),
            "itl_p50_ms": itl(rows, 0.5), "itl_p99_ms": itl(rows, 0.99), "tok_s": run["throughput_tok_s"],
            "hits": sum(r["hit_tokens"] for r in rows), "oracle": sum(r["oracle_hit"] for r in rows),
            "bytes": t.get("bytes", 0.0), "descriptors": t.get("descriptors", 0.0),
            "transfers": t.get("transfers", 0.0), "xfer_s": secs,
            "d_alone": (sum(r.get("computed_on") == "decode" for r in rows)  # our proxy's usage.hybrid_pd says
                        if any(r.get("computed_on") for r in rows) else None),
            "gb_s": t.get("bytes", 0.0) / secs / 1e9 if secs else None, "errors": len(run["errors"]),
            "rates": run.get("placement_rates") or None}  # ours' placement model by the cell's end


def itl(rows: list[dict], q: float):
    """A percentile of every token gap of these requests pooled (parts from before 2026-11-24 carry only each
    request's median gap: then the percentile of those)."""
    if all("gaps_ms" in r for r in rows):
        return pct([g for r in rows for g in r["gaps_ms"]], q)
    return ms(pct([r["itl_s"] for r in rows], q))


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


TIE_MARGIN = 0.1  # nats between the top two tokens under which bf16 noise may pick either


def consistent(row: dict, ref: dict, tie: float = TIE_MARGIN) -> bool | None:
    """Same greedy tokens as `ref`, or the first difference falls where either side's top two tokens were
    within `tie` of each other (both engines right, rounding picked differently). None without logprobs."""
    a, b = row.get("tokens"), ref.get("tokens")
    if not a or not b:
        return None
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            margins = [m[i] for m in (row.get("margins"), ref.get("margins")) if m and i < len(m) and m[i] is not None]
            return bool(margins) and min(margins) < tie
    return len(a) == len(b)


def merge(folder: Path, headline: int) -> dict:
    parts = {}
    for path in sorted(folder.glob("part-*.json*")):  # committed parts are gzipped (part-*.json.gz)
        part = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
        parts[part["setup"] + part.get("tag", "")] = part
    base = {n: p for n, p in parts.items() if not p.get("tag")}
    ref = {key(r): r["text"] for run in base.get("colocated", {}).get("runs", []) for r in run["rows"]}
    ref_rows = {key(r): r for run in base.get("colocated", {}).get("runs", []) for r in run["rows"]}
    up = {key(r): r["text"] for run in base.get("upstream", {}).get("runs", []) for r in run["rows"]}
    ref_ttft = {key(r): r["ttft_s"] for run in base.get("colocated", {}).get("runs", []) for r in run["rows"]}
    tables, equal = {}, {}
    for name, part in parts.items():
        for run in part["runs"]:
            s = summarize(run)
            rows = run["rows"]
            matched = [r for r in rows if key(r) in ref]
            s["equal"] = f"{sum(r['text'] == ref[key(r)] for r in matched)}/{len(matched)}" if matched else "-"
            tables[(run["workload"], run["length"], run["concurrency"], name)] = s
        rows = [r for run in part["runs"] for r in run["rows"] if key(r) in ref]
        equal[name] = sum(r["text"] == ref[key(r)] for r in rows) / len(rows) if rows else None
        ties = [consistent(r, ref_rows[key(r)]) for r in rows]
        ties = [t for t in ties if t is not None]
        equal[name + " up to near-ties"] = sum(ties) / len(ties) if ties else None
        c1 = [r for run in part["runs"] for r in run["rows"] if key(r) in up and r["concurrency"] == 1]
        equal[name + " vs upstream, c=1"] = sum(r["text"] == up[key(r)] for r in c1) / len(c1) if c1 else None

    def get(setup, wl, length, conc, field):
        return (tables.get((wl, length, conc, setup)) or {}).get(field)

    concs = sorted({k[2] for k in tables})
    top = max(concs) if concs else 1
    ours = "hybrid-pd-1p1d"
    dlocal = []
    for run in base.get(ours, {}).get("runs", []):
        for r in run["rows"]:
            if r["concurrency"] == 1 and r["turn"] > 0 and r.get("bytes", 1) == 0 and r["hit_tokens"] > 0 \
                    and ref_ttft.get(key(r)):
                dlocal.append(r["ttft_s"] / ref_ttft[key(r)])
    copy = {c["bytes"]: c for c in base.get(ours, {}).get("device_copy", [])}
    xfer = [(r["bytes"], r["transfer_seconds"]) for run in base.get(ours, {}).get("runs", []) for r in run["rows"]
            if r.get("bytes") and r.get("transfer_seconds") and r["prompt_tokens"] >= headline]
    # next to a copy from P's GPU to D's when P had a GPU of its own, else within the GPU
    speed = {b: c.get("peer_gb_s") or c["contiguous_gb_s"] for b, c in copy.items()}
    xfer_ratio = [(b / s) / speed[int(b)] / 1e9 for b, s in xfer if int(b) in speed]
    alone = {a["concurrency"]: a for a in base.get(ours, {}).get("decode_alone", []) if a.get("itl_p50_ms")}
    ratios = {
        "ttft_p50_vs_upstream_c1": ratio(get(ours, "agentic", headline, 1, "ttft_p50_ms"),
                                      get("upstream", "agentic", headline, 1, "ttft_p50_ms")),
        "throughput_vs_upstream": ratio(get(ours, "agentic", headline, top, "tok_s"),
                                        get("upstream", "agentic", headline, top, "tok_s")),
        "ttft_p50_vs_colocated_c1": ratio(get(ours, "agentic", headline, 1, "ttft_p50_ms"),
                                       get("colocated", "agentic", headline, 1, "ttft_p50_ms")),
        "dlocal_ttft_vs_colocated": statistics.median(dlocal) if dlocal else None,
        "itl_p50_vs_colocated": ratio(get(ours, "agentic", headline, top, "itl_p50_ms"),
                                      get("colocated", "agentic", headline, top, "itl_p50_ms")),
        "itl_p50_vs_decode_alone": ratio(get(ours, "agentic", headline, top, "itl_p50_ms"),
                                         (alone.get(top) or {}).get("itl_p50_ms")),
        "transfer_vs_device_copy": statistics.median(xfer_ratio) if xfer_ratio else None,
        "equal_to_colocated": equal.get(ours),
        "equal_to_upstream_c1": equal.get(ours + " vs upstream, c=1"),
        "equal_to_colocated_up_to_ties": equal.get(ours + " up to near-ties"),
    }
    phases = {n: [phase_row(p, "toy" if n.startswith("upstream") else "engine") for p in part["probe"]]
              for n, part in parts.items()}
    # ours' PD turns in the probe; where ours served them on D alone, those of its always-remote variant (same proxy
    # and engines, every turn through P: the PD path's own tax)
    tax_from = ours if pd_tax(phases, ours) is not None else f"{ours}-always-remote"
    ratios["pd_overhead_ms_c1"] = pd_tax(phases, tax_from)
    ratios["pd_overhead_ms_c1_upstream"] = pd_tax(phases, "upstream")
    # the same with P computing N-1 tokens and D the last one (--prefiller-stop last) instead of D the tail past
    # P's aligned boundary in a prefill step of its own (2026-11-27-h100x2-qwen3next-pd-tax-vllm033)
    ratios["pd_overhead_ms_c1_at_n_minus_1"] = pd_tax(phases, f"{ours}-always-remote-prefiller-stop-last")
    # and with D's request sent beside P's (--early-decode: D admits it while P computes)
    ratios["pd_overhead_ms_c1_early_decode"] = pd_tax(phases, f"{ours}-always-remote-prefiller-stop-last-early-decode")
    ratios["proxy_added_ms_p50"] = proxy_added(phases, ours)
    ratios["prefill_vs_upstream_prefill"] = prefill_vs_upstream(folder, "hybrid")
    ratios["prefill_vs_upstream_prefill_same_work"] = prefill_vs_upstream(folder, "hybrid-full")
    judged_ratios, judged_basis = judged(parts, tables, headline)
    ratios |= judged_ratios
    extra = folder / "extra_ratios.json"  # figures measured elsewhere (e.g. the CPU bed), each with its source
    if extra.exists():
        ratios.update({k: v["value"] for k, v in json.loads(extra.read_text()).items()})
    return {"ratios": ratios, "ratio_basis": {"headline_length": headline, "throughput_concurrency": top,
                                              "pd_overhead_from": tax_from if ratios["pd_overhead_ms_c1"] is not None
                                              else None,
                                              "dlocal_turns": len(dlocal), "transfers_compared": len(xfer_ratio),
                                              "judged": judged_basis},
            "equal_to_colocated": equal,
            "tables": [dict(workload=k[0], length=k[1], concurrency=k[2], setup=k[3], **v)
                       for k, v in sorted(tables.items())],
            "phases": phases,
            "device_copy": {n: p.get("device_copy", []) for n, p in parts.items()},
            "decode_alone": {n: p.get("decode_alone", []) for n, p in parts.items() if p.get("decode_alone")},
            "start_s": {n: p.get("start_s") for n, p in parts.items()},
            "block": {n: p.get("block") for n, p in parts.items()},
            "versions": next((p.get("versions") for p in parts.values() if p.get("versions")), {}),
            "errors": {n: p["errors"] for n, p in parts.items() if p["errors"]},
            "args": {n: p["args"] for n, p in parts.items()}}


def summary_md(res: dict, title: str) -> str:
    r = res["ratios"]
    lines = [f"## {title}: generated tables", "",
             "Ratios (hybrid-pd / peer, same run; basis in results.json `ratio_basis`):", ""]
    lines += [f"- `{k}`: {fmt(v, '.3g')}" for k, v in r.items()]
    lines += basis_md(res["ratio_basis"].get("judged") or {})
    lines += ["", "| workload | length | c | set-up | TTFT p50 ms | TTFT p90 ms | ITL p50 ms | ITL p99 ms | out tok/s "
              "| hits / oracle "
              "| bytes | descriptors | transfers | D alone | xfer ms | GB/s | equal to colocated | errors |",
              "|---" * 18 + "|"]
    for t in res["tables"]:
        lines.append(f"| {t['workload']} | {t['length']} | {t['concurrency']} | {t['setup']} | "
                     f"{fmt(t['ttft_p50_ms'])} | "
                     f"{fmt(t['ttft_p90_ms'])} | {fmt(t['itl_p50_ms'], '.2f')} | {fmt(t.get('itl_p99_ms'), '.2f')} | "
                     f"{fmt(t['tok_s'], '.0f')} | "
                     f"{t['hits']} / {t['oracle']} | {t['bytes']:.0f} | {t['descriptors']:.0f} | "
                     f"{t['transfers']:.0f} | {fmt(t.get('d_alone'), 'd')} | "
                     f"{fmt(t['xfer_s'] * 1e3 if t['xfer_s'] else None)} | {fmt(t['gb_s'], '.1f')} | {t['equal']} | "
                     f"{t['errors']} |")
    lines += ["", "### Phase breakdown (one request alone; ms; from every server's /metrics before and after it)", "",
              "turn 0 is new; turns 1-2 extend the previous prompt. p call: the proxy's P stage (toy flow: the "
              "client's P call); xfer: the decoder connector's transfer time; d queue / d prefill / d ttft: the "
              "serving engine's queue time (on a PD turn it holds the wait for the transfer), "
              "scheduled-to-first-token and arrival-to-first-token; proxy+HTTP = TTFT - p call - d ttft; d wait beyond "
              "xfer = d queue - xfer.", "",
              "| set-up | phase | turn | prompt | hit | mode | TTFT | proxy+HTTP | p call | p queue | "
              "p prefill | xfer | "
              "bytes | d queue | d wait beyond xfer | d prefill | d ttft |", "|---" * 17 + "|"]
    for name, rows in res["phases"].items():
        for p in rows:
            lines.append(f"| {name} | {p['phase']} | {p['turn']} | {p['prompt']} | {p['hit']} | {p['mode']} | "
                         f"{fmt(p['ttft_ms'])} | {fmt(p['glue_ms'])} | {fmt(p['p_call_ms'])} | "
                         f"{fmt(p['p_queue_ms'])} | {fmt(p['p_prefill_ms'])} | {fmt(p['xfer_ms'])} | "
                         f"{p['bytes']:.0f} | "
                         f"{fmt(p['d_queue_ms'])} | {fmt(p['d_wait_ms'])} | {fmt(p['d_prefill_ms'])} | "
                         f"{fmt(p['d_ttft_ms'])} |")
    if res.get("decode_alone"):
        lines += ["", "### The decoder with no prefill load (N new prompts at once straight to it; token gaps while "
                  "all N decode)", "", "| set-up | N | prompt | gaps | window s | ITL p50 ms | ITL p99 ms |",
                  "|---" * 7 + "|"]
        for name, rows in res["decode_alone"].items():
            for a in rows:
                lines.append(f"| {name} | {a['concurrency']} | {a['length']} | {a.get('gaps', '-')} | "
                             f"{fmt(a.get('window_s'), '.2f')} | {fmt(a.get('itl_p50_ms'), '.2f')} | "
                             f"{fmt(a.get('itl_p99_ms'), '.2f')} |")
    lines += rates_md(res["tables"])
    lines += ["", "### Device-to-device copy of the same byte counts (same call, after the engines stopped; GPU to "
              "GPU: from P's GPU to D's)", "",
              "| set-up | bytes | descriptors | contiguous GB/s | in pieces GB/s | GPU to GPU GB/s |",
              "|---" * 6 + "|"]
    for name, rows in res["device_copy"].items():
        for c in rows[:12]:
            lines.append(f"| {name} | {c['bytes']} | {c['descriptors']} | {c['contiguous_gb_s']:.0f} | "
                         f"{c['pieces_gb_s']:.0f} | {fmt(c.get('peer_gb_s'), '.0f')} |")
    lines += ["", f"Engine start (s): {json.dumps(res['start_s'])}  ", f"Aligned block: {json.dumps(res['block'])}  ",
              f"Versions: {json.dumps(res['versions'])}"]
    if res["errors"]:
        lines += ["", "Errors (first line each):", ""]
        lines += [f"- {n}: {e.strip().splitlines()[-1][:200]}" for n, es in res["errors"].items() for e in es]
    return "\n".join(lines) + "\n"


RATES = ("prefill_step_ms", "prefill_ms_per_token", "prefill_ms_per_token_per_kctx", "hop_ms", "step_ms",
         "step_ms_per_seq", "prefiller_call_factor", "next_remote")


def rates_md(tables: list[dict]) -> list[str]:
    """Our proxy's placement model as it had learned it by each cell's end (parts from 2026-11-26 on)."""
    rows = [t for t in tables if t.get("rates")]
    if not rows:
        return []
    out = ["", "### The placement model's rates, learned by each cell's end (ours; `hybrid_pd_proxy_placement_rate`)",
           "", "| workload | length | c | set-up | " + " | ".join(RATES) + " |", "|---" * (4 + len(RATES)) + "|"]
    for t in rows:
        out.append(f"| {t['workload']} | {t['length']} | {t['concurrency']} | {t['setup']} | "
                   + " | ".join(fmt(t["rates"].get(k), ".4g") for k in RATES) + " |")
    return out


def plot(res: dict, out: Path) -> list[str]:
    """ttft.png: TTFT p50 per workload, length and concurrency and set-up; phases.png: where a probe request's
    time goes (warm phase), per set-up and turn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    setups = [s for s in SETUPS if any(t["setup"] == s for t in res["tables"])]
    cells = sorted({(t["workload"], t["length"], t["concurrency"]) for t in res["tables"]})
    fig, ax = plt.subplots(figsize=(11, 4))
    width = 0.8 / max(1, len(setups))
    for i, name in enumerate(setups):
        vals = {(t["workload"], t["length"], t["concurrency"]): t["ttft_p50_ms"] for t in res["tables"]
                if t["setup"] == name}
        ax.bar([j + i * width for j in range(len(cells))], [vals.get(c) or 0 for c in cells], width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cells))],
                  [f"{w[:8]}\n{n // 1024}k c={c}" for w, n, c in cells], fontsize=7)
    ax.set_ylabel("TTFT p50 (ms)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "ttft.png", dpi=90)
    parts = [("p_call_ms", "P call (proxy's P stage)"), ("xfer_ms", "transfer"),
             ("d_ttft_ms", "D arrival -> first token, less the transfer")]
    rows = [(name, p) for name in setups for p in res["phases"].get(name, []) if p["phase"] == "warm"]
    fig, ax = plt.subplots(figsize=(9, 4))
    labels = [f"{n}\nturn {p['turn']}" for n, p in rows]
    bottom = [0.0] * len(rows)
    for key_, label in parts:
        vals = [p.get(key_) or 0.0 for _, p in rows]
        if key_ == "d_ttft_ms":  # D waits for the transfer inside its queue time: count that time once
            vals = [max(0.0, v - (p.get("xfer_ms") or 0.0)) for v, (_, p) in zip(vals, rows)]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.plot(range(len(rows)), [p["ttft_ms"] or 0 for _, p in rows], "k_", markersize=20, label="client TTFT")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("ms")
    ax.set_title("Warm probe requests (8k agentic): where the time goes")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "phases.png", dpi=90)
    plt.close("all")
    return ["ttft.png", "phases.png"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--headline-length", type=int, default=8192)
    ap.add_argument("--title", default="GPU benchmark")
    args = ap.parse_args(argv)
    res = merge(args.folder, args.headline_length)
    (args.folder / "results.json").write_text(json.dumps(res, indent=1))
    header = args.folder / "header.md"  # the run's narrative (command, machine, findings), written by hand
    pngs = plot(res, args.folder) + pareto.plot(res, args.folder, length=args.headline_length)
    text = (header.read_text() + "\n" if header.exists() else "") + summary_md(res, args.title)
    text += "\nPlots: " + ", ".join(f"![{p}]({p})" for p in pngs) + "\n"
    (args.folder / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
