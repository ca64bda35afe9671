"""What the placement model predicted for each turn and what the turn then took, from a proxy's --log-placement log.

    python3 benchmarks/gpu/placement_log.py SETUP-logs.tar.gz|proxy.log [--first N] [--last N]

The proxy logs one line per decision (the options: D alone, each prefiller to the boundary and to N-1, with their
predicted TTFT, stall and cost) and, for a streamed turn, one with the TTFT it had (proxy/placement/decider.py):
since the factor on P's call was learned, also what the option priced P's call at (before the factor) and the
factor after the turn. Prints a markdown table per turn (request counter, prompt, D's streams as the model saw
them, the choice, the predicted and measured TTFT, P's call; where the log has them, P's call as predicted: its
price times the factor in force at the decision, the last one logged before it, and the factor after the turn)
and a summary per choice: turns, median measured / predicted TTFT (and P's call). --first/--last keep the request
counters in that range (e.g. one workload's turns). Logs from before the factor read as they did.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tarfile
from pathlib import Path

DECIDED = re.compile(r"placement pd-\w+-(\d+): (\d+) tokens -> (\S+) \((\w+)\); (.*)$")
OPTION = re.compile(r"(\S+) ttft ([\d.]+) stall ([\d.]+) cost ([\d.]+) P (\d+) D (\d+)(?: behind ([\d.]+))?")
MEASURED = re.compile(
    r"placement pd-\w+-(\d+): TTFT ([\d.]+) ms \(predicted ([\d.]+)\), (\w+)"
    r"(?:, P's call ([\d.]+) ms(?: \(priced ([\d.]+)\))?)?(?:, P factor ([\d.]+))?"
)


def proxy_lines(path: Path) -> list[str]:
    if path.suffixes[-2:] == [".tar", ".gz"]:
        with tarfile.open(path) as tar:
            for m in tar.getmembers():
                if m.name.endswith("proxy.log"):
                    f = tar.extractfile(m)
                    return f.read().decode(errors="replace").splitlines() if f else []
        return []
    return path.read_text(errors="replace").splitlines()


def turns(lines: list[str]) -> list[dict]:
    by: dict[int, dict] = {}
    factor = 1.0  # the factor on P's call in force: neutral until a turn logs one
    for line in lines:
        if m := DECIDED.search(line):
            options = [
                {
                    "name": o[0],
                    "ttft": float(o[1]),
                    "stall": float(o[2]),
                    "cost": float(o[3]),
                    "p": int(o[4]),
                    "d": int(o[5]),
                    "behind": float(o[6]) if o[6] else 0.0,  # the prefiller's queue term (logged since 2026-11-27)
                }
                for o in OPTION.findall(m[5])
            ]
            local = options[0]
            streams = (local["cost"] - local["ttft"]) / local["stall"] if local["stall"] else 0.0
            choice = m[3].rsplit("@", 1)[-1] if "@" in m[3] else "D"
            by[int(m[1])] = {
                "id": int(m[1]),
                "tokens": int(m[2]),
                "choice": choice,
                "reason": m[4],
                "streams": streams,
                "options": options,
                "factor_decided": factor,
            }
        elif (m := MEASURED.search(line)) and int(m[1]) in by:
            by[int(m[1])] |= {"ttft": float(m[2]), "predicted": float(m[3]), "mode": m[4]}
            if m[5]:
                by[int(m[1])]["p_ms"] = float(m[5])
            if m[6]:
                by[int(m[1])]["p_predicted"] = float(m[6]) * by[int(m[1])]["factor_decided"]
            if m[7]:
                factor = by[int(m[1])]["factor"] = float(m[7])
    return [by[k] for k in sorted(by)]


def table(rows: list[dict]) -> str:
    learned = any("factor" in r for r in rows)
    head = "| request | prompt | D's streams | choice | D alone computes | predicted TTFT | measured TTFT | P's call |"
    out = [head + (" P's call predicted | factor after |" if learned else ""), "|---" * (10 if learned else 8) + "|"]
    for r in rows:
        measured = f"{r['ttft']:.1f}" if "ttft" in r else "-"
        line = (
            f"| {r['id']} | {r['tokens']} | {r['streams']:.0f} | {r['choice']} | {r['options'][0]['d']} | "
            f"{r.get('predicted', float('nan')):.1f} | {measured} | {r.get('p_ms', '-')} |"
        )
        if learned:
            line += f" {_fmt(r.get('p_predicted'), 1)} | {_fmt(r.get('factor'), 3)} |"
        out.append(line)
    return "\n".join(out)


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def summary(rows: list[dict]) -> str:
    learned = any("p_predicted" in r for r in rows)
    out = [
        "| choice | turns | measured / predicted TTFT (median) | measured TTFT p50 ms |"
        + (" P's call / predicted (median) |" if learned else ""),
        "|---" * (5 if learned else 4) + "|",
    ]
    for choice in sorted({r["choice"] for r in rows}):
        got = [r for r in rows if r["choice"] == choice and "ttft" in r and r.get("predicted")]
        if got:
            ratio = statistics.median(r["ttft"] / r["predicted"] for r in got)
            p50 = statistics.median(r["ttft"] for r in got)
            line = f"| {choice} | {len(got)} | {ratio:.2f} | {p50:.1f} |"
            if learned:
                calls = [r["p_ms"] / r["p_predicted"] for r in got if r.get("p_predicted") and "p_ms" in r]
                line += f" {statistics.median(calls):.2f} |" if calls else " - |"
            out.append(line)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", type=Path)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--last", type=int, default=1 << 30)
    args = ap.parse_args(argv)
    rows = [r for r in turns(proxy_lines(args.log)) if args.first <= r["id"] <= args.last]
    if not rows:
        print(f"{args.log}: no placement lines (was the proxy run with --log-placement?)", file=sys.stderr)
        return 1
    print(table(rows), "", summary(rows), sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
