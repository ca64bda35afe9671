"""Where one cell's time went (a workload, prompt length and concurrency of a results folder), from the parts and our
proxy's --log-placement log: the figures a cell's analysis rests on.

    python3 benchmarks/gpu/cell_timeline.py RESULTS_DIR --concurrency 8 [--length 8192] [--workload agentic]

Prints markdown:
- per set-up (the colocated floor, upstream, ours): wall, output tok/s, when its sessions ended, a turn's mean TTFT
  and decode time (e2e - TTFT), the token gaps over --stall-ms (count and ms), and the prompt tokens computed
  (colocated: N - hit; upstream: P's N - 1 - hit, its hit being P's cached tokens; ours: the chosen option's P and D
  tokens from the placement line);
- ours, each turn served on D alone: the tokens D computed, D's streams as the model saw them, and the gaps over
  --stall-ms of other turns that overlap its prefill (sent to first token), then where every such gap fell; and
  the decision against the remote path: D alone's cost, the remote option's price, the P calls under way then
  (their P tokens, how long P took to answer them all) and the TTFT of the remote turns sent about then;
- ours, remote turns whose session's previous turn was served on D alone: what P computed (from its own hit) against
  N - 1 - D's hit, what it would have computed had it held D's prefix;
- ours, P's call as priced (times the factor in force at the decision) against as measured, in bins of the price;
- ours, each remote decision replayed with the prefiller's queue term (where the part has the rates the proxy
  learned and the aligned block): whether D alone would then have been chosen.

Times are the client's (rows' sent_s, ttft_s, gaps_ms; a gap spans the tokens between two text pieces). A row's
placement line is found by its prompt's tokens among the cell's decisions: the run of consecutive request counters
whose prompts are the cell's prompts.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import statistics
import sys
from pathlib import Path

from hybrid_pd.proxy.placement.cost_model import LAST, Rates, remote_tail

if __package__:  # imported: benchmarks.gpu.cell_timeline
    from .placement_log import proxy_lines, turns
else:  # run as a script: its own folder is on sys.path
    from placement_log import proxy_lines, turns  # type: ignore[no-redef]

OURS, SETUPS = "hybrid-pd-1p1d", ("colocated", "upstream", "hybrid-pd-1p1d")
PRICE_BINS = (250.0, 400.0)  # ms: P's call priced below, between, above
NEAR_S = 0.12  # s: the remote turns sent this close to a D-alone one stand for what the remote path took then


def cell(part: dict, workload: str, length: int, conc: int) -> dict | None:
    return next((r for r in part.get("runs", []) if (r["workload"], r["length"], r["concurrency"])
                 == (workload, length, conc)), None)


def times(row: dict) -> tuple[float, float, float, list[float]]:
    """(sent, first token, end, every text piece's arrival), in the client's seconds."""
    arrivals = [row["sent_s"] + row["ttft_s"]]
    for gap in row.get("gaps_ms") or []:
        arrivals.append(arrivals[-1] + gap / 1e3)
    return row["sent_s"], arrivals[0], row["sent_s"] + row["e2e_s"], arrivals


def stalls(rows: list[dict], over_ms: float) -> list[tuple[float, float, dict]]:
    """Every gap over `over_ms` as (from, to, its row)."""
    return [(a, b, r) for r in rows for a, b in zip(times(r)[3], times(r)[3][1:]) if (b - a) * 1e3 > over_ms]


def join(rows: list[dict], decisions: list[dict]) -> dict[int, dict]:
    """Each row's placement decision (id(row) -> the placement_log turn): the first run of len(rows) consecutive
    decisions whose prompt sizes are the rows', matched by size in the order the turns were sent."""
    want, n = sorted(r["prompt_tokens"] for r in rows), len(rows)
    for start in range(len(decisions) - n + 1):
        window = decisions[start:start + n]
        if sorted(d["tokens"] for d in window) == want:
            out = {}
            for r in sorted(rows, key=lambda r: r["sent_s"]):
                d = next(d for d in window if d["tokens"] == r["prompt_tokens"] and d["id"] not in
                         {x["id"] for x in out.values()})
                out[id(r)] = d
            return out
    return {}


def chosen(decision: dict) -> dict:
    """The option the decision took: D alone, or the prefiller's at its stop."""
    if decision["choice"] == "D":
        return decision["options"][0]
    return next(o for o in decision["options"] if o["name"].endswith("@" + decision["choice"]))


def computed(name: str, rows: list[dict], placed: dict[int, dict]) -> int | None:
    """Prompt tokens the set-up computed for the cell's turns (None where the parts cannot tell)."""
    if name == "colocated":
        return sum(r["prompt_tokens"] - r["hit_tokens"] for r in rows)
    if name == "upstream":
        return sum(r["prompt_tokens"] - 1 - r["hit_tokens"] for r in rows)
    if placed:
        return sum(chosen(d)["p"] + chosen(d)["d"] for d in placed.values())
    return None


def setups_table(runs: dict[str, dict], placed: dict[int, dict], over_ms: float) -> list[str]:
    out = [f"| set-up | wall s | out tok/s | sessions ended s | TTFT mean ms | decode mean ms | gaps > {over_ms:.0f} "
           "ms (ms) | prompt tokens computed |", "|---" * 8 + "|"]
    for name, run in runs.items():
        rows = run["rows"]
        t0 = min(r["sent_s"] for r in rows)
        ends = {}
        for r in rows:
            ends[r["session"]] = max(ends.get(r["session"], 0.0), times(r)[2] - t0)
        gaps = stalls(rows, over_ms)
        made = computed(name, rows, placed if name == OURS else {})
        out.append(f"| {name} | {run['wall_s']:.2f} | {run['throughput_tok_s']:.0f} | {min(ends.values()):.2f}-"
                   f"{max(ends.values()):.2f} | {statistics.fmean(r['ttft_s'] for r in rows) * 1e3:.0f} | "
                   f"{statistics.fmean(r['e2e_s'] - r['ttft_s'] for r in rows) * 1e3:.0f} | {len(gaps)} "
                   f"({sum(b - a for a, b, _ in gaps) * 1e3:.0f}) | {'-' if made is None else made} |")
    return out


def local_table(rows: list[dict], placed: dict[int, dict], over_ms: float) -> list[str]:
    """Ours: each D-alone turn and the gaps of other turns over `over_ms` that overlap its prefill."""
    local = [r for r in rows if r.get("computed_on") == "decode"]
    gaps = stalls(rows, over_ms)
    out = [f"| request | session/turn | D computed | D's streams (model) | gaps > {over_ms:.0f} ms overlapping "
           "(ms) |", "|---" * 5 + "|"]
    for r in sorted(local, key=lambda r: r["sent_s"]):
        sent, first, _, _ = times(r)
        hit = [b - a for a, b, other in gaps if other is not r and a < first and b > sent]
        d = placed.get(id(r))
        request, streams = (d["id"], f"{d['streams']:.0f}") if d else ("-", "-")
        out.append(f"| {request} | {r['session']}/{r['turn']} | {r['prompt_tokens'] - r['hit_tokens']} | {streams} | "
                   f"{len(hit)} ({sum(hit) * 1e3:.0f}) |")
    overlap = lambda a, b, r: any(x is not r and x["sent_s"] < b and times(x)[1] > a for x in local)  # noqa: E731
    first_token = lambda a, b, r: any(  # noqa: E731
        x is not r and x.get("computed_on") == "prefill" and a <= times(x)[1] <= b for x in rows)
    at_local = [(a, b) for a, b, r in gaps if overlap(a, b, r)]
    at_remote = [(a, b) for a, b, r in gaps if not overlap(a, b, r) and first_token(a, b, r)]
    out += ["", f"Gaps over {over_ms:.0f} ms: {len(gaps)} ({sum(b - a for a, b, _ in gaps) * 1e3:.0f} ms); overlapping "
            f"a D-alone prefill {len(at_local)} ({sum(b - a for a, b in at_local) * 1e3:.0f} ms); else at a remote "
            f"turn's first token {len(at_remote)}; neither {len(gaps) - len(at_local) - len(at_remote)}."]
    return out


def choice_table(rows: list[dict], placed: dict[int, dict], near_s: float = NEAR_S) -> list[str]:
    """Ours: each D-alone decision against the remote path: D alone's cost in the objective (TTFT + streams x stall),
    the remote option's predicted TTFT, the P tokens of the remote calls under way then and how long P took to answer
    them all, and the median TTFT the remote turns sent within `near_s` of it had."""
    def p_end(r: dict) -> float:
        return r["sent_s"] + placed[id(r)]["p_ms"] / 1e3

    remote = [r for r in rows if r.get("computed_on") == "prefill" and placed.get(id(r), {}).get("p_ms")]
    out = ["| request | D alone's cost ms | remote predicted TTFT ms | P tokens under way | P answered them within "
           f"s | remote turns within {near_s:.2f} s: TTFT median ms |", "|---" * 6 + "|"]
    for r in sorted(rows, key=lambda r: r["sent_s"]):
        d = placed.get(id(r))
        if r.get("computed_on") != "decode" or not d:
            continue
        busy = [x for x in remote if x["sent_s"] < r["sent_s"] < p_end(x)]
        near = [x["ttft_s"] * 1e3 for x in remote if abs(x["sent_s"] - r["sent_s"]) <= near_s]
        priced = min((o["ttft"] for o in d["options"][1:]), default=float("nan"))  # the fastest remote option
        out.append(f"| {d['id']} | {d['options'][0]['cost']:.0f} | {priced:.0f} | "
                   f"{sum(chosen(placed[id(x)])['p'] for x in busy)} | "
                   f"{max((p_end(x) - r['sent_s'] for x in busy), default=0.0):.2f} | "
                   f"{statistics.median(near) if near else float('nan'):.0f} |")
    return out


def cold_table(rows: list[dict], placed: dict[int, dict]) -> list[str]:
    """Ours: remote turns after a D-alone turn of their session: P computed from its own hit what D held."""
    by = {(r["session"], r["turn"]): r for r in rows}
    out = ["| request | session/turn | P computed | N - 1 - D's hit | more than that |", "|---" * 5 + "|"]
    total = 0
    for r in sorted(rows, key=lambda r: r["sent_s"]):
        before = by.get((r["session"], r["turn"] - 1))
        d = placed.get(id(r))
        if r.get("computed_on") == "prefill" and before and before.get("computed_on") == "decode" and d:
            p, warm = chosen(d)["p"], r["prompt_tokens"] - 1 - r["hit_tokens"]
            total += p - warm
            out.append(f"| {d['id']} | {r['session']}/{r['turn']} | {p} | {warm} | {p - warm} |")
    return out + ["", f"P computed {total} tokens that D held, on these turns."]


def price_table(placed: dict[int, dict]) -> list[str]:
    remote = [d for d in placed.values() if d.get("p_predicted") and d.get("p_ms")]
    out = ["| P's call priced (x factor) | turns | priced median ms | measured median ms |", "|---" * 4 + "|"]
    edges = (0.0, *PRICE_BINS, float("inf"))
    for lo, hi in zip(edges, edges[1:]):
        got = [d for d in remote if lo <= d["p_predicted"] < hi]
        if got:
            out.append(f"| {lo:.0f}-{hi:.0f} | {len(got)} | {statistics.median(d['p_predicted'] for d in got):.0f} | "
                       f"{statistics.median(d['p_ms'] for d in got):.0f} |")
    return out


def prefill_part(option: dict, tokens: int, block: int, rates: Rates) -> float:
    """A remote option's prefill on P at `rates` (as the model prices it: its P tokens past P's hit, in its steps)."""
    stop = option["name"].rsplit("@", 1)[-1]
    end = tokens - remote_tail(tokens, block, stop)
    u = option["p"]
    hit = max(end - u, 0)
    steps = rates.steps(end, hit, block) if stop == LAST else rates.chunks(u)
    return rates.prefill_ms(u, hit, steps)


def queue_table(rows: list[dict], placed: dict[int, dict], block: int, rates: Rates) -> list[str]:
    """Ours: each remote decision replayed with the prefiller's queue term (cost_model.py, `prefiller_queue`): the P
    calls under way when it was sent (the P load the proxy saw, as far as the client's rows tell), the term on the
    chosen option (that many x f x its prefill on P at `rates`), its cost with and without it, D alone's cost, and
    whether D alone would then have been chosen (every remote option with its own term; the turns after it as they
    were)."""
    def p_end(r: dict) -> float:
        return r["sent_s"] + placed[id(r)]["p_ms"] / 1e3

    remote = [r for r in rows if r.get("computed_on") == "prefill" and placed.get(id(r), {}).get("p_ms")]
    out = ["| request | P calls under way | term ms | remote cost ms | with the term | D alone's cost | D alone "
           "then | measured TTFT ms |", "|---" * 8 + "|"]
    moved: list[float] = []
    for r in sorted(remote, key=lambda r: r["sent_s"]):
        d = placed[id(r)]
        load = sum(1 for x in remote if x is not r and x["sent_s"] < r["sent_s"] < p_end(x))
        f = d.get("factor_decided", 1.0)
        terms = [load * f * prefill_part(o, d["tokens"], block, rates) for o in d["options"][1:]]
        best = min(o["cost"] + t for o, t in zip(d["options"][1:], terms))
        pick = chosen(d)
        term = terms[d["options"][1:].index(pick)]
        local = d["options"][0]["cost"]
        if local <= best:
            moved.append(r["ttft_s"] * 1e3)
        out.append(f"| {d['id']} | {load} | {term:.0f} | {pick['cost']:.0f} | {pick['cost'] + term:.0f} | "
                   f"{local:.0f} | {'yes' if local <= best else 'no'} | {r['ttft_s'] * 1e3:.0f} |")
    median = f"{statistics.median(moved):.0f}" if moved else "-"
    return out + ["", f"With the term, D alone would have been chosen on {len(moved)} of {len(remote)} remote turns "
                  f"(their measured TTFT median {median} ms on P)."]


TERM_SINCE = "2026-11-27"  # the first GPU run whose proxy priced the prefiller's queue term (on by default)


def queue_term_on(part: dict, placed: dict[int, dict]) -> bool:
    """Whether the run's proxy already priced the prefiller's queue term: a decision logged it (`behind`), or the run
    is from TERM_SINCE on (the term on by default; logged since a later commit) without --no-prefiller-queue."""
    if any(o.get("behind") for d in placed.values() for o in d["options"]):
        return True
    args = part.get("args", {}).get("proxy_args", "")
    return part.get("date", "") >= TERM_SINCE and "--no-prefiller-queue" not in args


def report(folder: Path, workload: str, length: int, conc: int, over_ms: float) -> str:
    parts = {}
    for name in SETUPS:
        for path in (folder / f"part-{name}.json.gz", folder / f"part-{name}.json"):  # gzipped when over 200 KB
            if path.exists():
                raw = path.read_bytes()
                parts[name] = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
                break
    runs = {n: r for n, p in parts.items() if (r := cell(p, workload, length, conc))}
    log = folder / f"{OURS}-logs.tar.gz"
    placed = join(runs[OURS]["rows"], turns(proxy_lines(log))) if OURS in runs and log.exists() else {}
    lines = [f"## {folder.name}: {workload} {length} c={conc}", "", *setups_table(runs, placed, over_ms)]
    if OURS in runs and placed:
        rows = runs[OURS]["rows"]
        for table in (local_table(rows, placed, over_ms), choice_table(rows, placed), cold_table(rows, placed),
                      price_table(placed)):
            lines += ["", *table]
        fitted = runs[OURS].get("placement_rates")
        if queue_term_on(parts[OURS], placed):
            lines += ["", "The prefiller's queue term was on in this run: the remote costs above carry it (no replay)."]
        elif fitted and parts[OURS].get("block"):  # the rates the proxy had learned by the cell's end
            rates = Rates(**{k: fitted[k] for k in fitted if k in Rates.__dataclass_fields__})
            # a proxy from before --align-split existed priced vLLM 0.26's split (its rates do not name it)
            rates = dataclasses.replace(rates, chunk_tokens=int(rates.chunk_tokens),
                                        align_split=bool(fitted.get("align_split", 1)))
            lines += ["", *queue_table(rows, placed, parts[OURS]["block"], rates)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--workload", default="agentic")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--concurrency", type=int, required=True)
    ap.add_argument("--stall-ms", type=float, default=50.0)
    args = ap.parse_args(argv)
    sys.stdout.write(report(args.folder, args.workload, args.length, args.concurrency, args.stall_ms))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
