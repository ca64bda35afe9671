"""Replay a GPU run's placement log through the proxy's online rates (proxy/placement/online_rates.py), as the proxy
fed them, and price each turn again at the rates learned so far: how far the prices were from what the turns
measured. Two ways: `as run` (this proxy: the prefill and hop fits fed from every turn, D's queue priced at the
per-token rate, cost_model.d_queue_ms) and `quiet` (an alternative tried on 2026-11-27 and not adopted: those fits
fed only from turns during which D had no other prompt of this proxy's to compute, D's queue priced in steps and
tokens as P's is, `steps_d_queue_ms`).

    python3 benchmarks/gpu/rates_replay.py RESULTS_DIR [RESULTS_DIR/fresh-c8 ...] [--block 544] [--no-align-split]

What it takes from the log (--log-placement, read by benchmarks/gpu/placement_log.py): each turn's decision time
(the log line's), prompt, D's streams, D's and P's hits, the choice, its measured TTFT and P's call. What it rebuilds:
P's queue at each decision (this proxy's P calls under way then: their P tokens and count), D's (the uncached
prompts of the turns D was serving alone and had not yet answered), whether P ran a call alone and whether D
computed a turn's prompt, or took a pulled turn's first step, with no other such prompt of this proxy's on it.
Printed: per way of learning, the median of measured / priced P call (remote turns), of measured / predicted TTFT
(remote and D-alone turns), their quotient (what a choice between the two rests on: under 1, remote turns were
priced dearer than D alone against what both measured), and the rates at the log's end. The turns keep the run's
choices (a turn priced elsewhere has no measured time there).
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import re
import statistics
import sys
from pathlib import Path
from unittest import mock

if __package__:
    from .placement_log import proxy_lines, turns
else:  # run as a script: its own folder is on sys.path
    from placement_log import proxy_lines, turns  # type: ignore[no-redef]

from hybrid_pd.proxy.placement import cost_model
from hybrid_pd.proxy.placement.cost_model import Rates, WorkerView, decoder_tail_ms, place, remote_tail
from hybrid_pd.proxy.placement.online_rates import OnlineRates


def steps_d_queue_ms(rates: Rates, d: WorkerView) -> float:
    """D's queue priced as P's (cost_model.queue_ms: the steps its tokens need, and the tokens), for `quiet`."""
    return cost_model.queue_ms(rates, d.queued_tokens, 0) if d.queued_tokens > 0 else 0.0


STAMP = re.compile(r"^\S+ (\d\d):(\d\d):(\d\d),(\d+) .*placement (pd-\w+-\d+): \d+ tokens ->")
DECIDED, ANSWERED, ENDED = 0, 1, 2  # a turn's events: the decision, P's answer (remote turns), its first token
WAYS = ("as run", "quiet")


def decided_at(lines: list[str]) -> dict[int, float]:
    """Each request's decision time (s), from its decision line's stamp."""
    out = {}
    for line in lines:
        if m := STAMP.search(line):
            out[int(m[5].rsplit("-", 1)[1])] = int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) + int(m[4]) / 1000
    return out


def replay(lines: list[str], block: int, quiet_only: bool, align_split: bool = True) -> dict:
    """The log's turns in the order the proxy saw their events; prices at the rates learned so far. `align_split`:
    as the run's proxy priced align mode's steps (on before --align-split existed; its flag since)."""
    at = decided_at(lines)
    by = {t["id"]: t for t in turns(lines) if t["id"] in at and "ttft" in t}
    online = OnlineRates(dataclasses.replace(cost_model.PRIORS, align_split=align_split))
    todo: list[tuple[float, int, int]] = []
    for i, t in by.items():
        heapq.heappush(todo, (at[i], DECIDED, i))
        if t["choice"] != "D" and t.get("p_ms") is not None:
            heapq.heappush(todo, (at[i] + t["p_ms"] / 1000, ANSWERED, i))
        heapq.heappush(todo, (at[i] + t["ttft"] / 1000, ENDED, i))
    on_p: dict[int, tuple[float, float, int]] = {}  # remote turns: (decided, P answered, P tokens)
    on_d: dict[int, tuple[float, float, int]] = {}  # D-alone turns: (decided, first token, tokens D computes)
    priced: dict[int, tuple[float, float]] = {}  # (P's call priced with f, TTFT predicted)
    ratios: dict[str, list[float]] = {"p_call": [], "remote_ttft": [], "local_ttft": []}
    while todo:
        now, event, i = heapq.heappop(todo)
        t = by[i]
        n, local = t["tokens"], t["options"][0]
        d_hit = n - local["d"]
        last = next(o for o in t["options"] if o["name"].endswith("@last")) if len(t["options"]) > 1 else None
        p_hit = n - 1 - last["p"] if last else 0
        if event == DECIDED:
            busy_p = [tok for b, a, tok in on_p.values() if b <= now < a]
            busy_d = [tok for b, a, tok in on_d.values() if b <= now < a]
            d = WorkerView("d", d_hit, t["streams"], sum(busy_d))
            p = WorkerView("p", p_hit, load=len(busy_p), queued_tokens=sum(busy_p))
            placement = place(n, d, [p] if last else [], online.rates, aligned_block=block)
            if t["choice"] == "D":
                priced[i] = (0.0, placement.options[0].ttft_ms)
                on_d[i] = (now, now + t["ttft"] / 1000, local["d"])
            else:
                option = next(o for o in placement.options if o.stop == t["choice"])
                priced[i] = (option.prefiller_ms * online.rates.prefiller_call_factor, option.ttft_ms)
                chosen = next(o for o in t["options"] if o["name"].endswith("@" + t["choice"]))
                on_p[i] = (now, now + (t.get("p_ms") or 0.0) / 1000, chosen["p"])
            continue
        if event == ANSWERED:
            online.observe_prefiller_call(priced[i][0] / online.rates.prefiller_call_factor, t["p_ms"])
            ratios["p_call"].append(t["p_ms"] / priced[i][0])
            continue
        rates = online.rates
        if t["choice"] == "D":
            begun, ended, tokens = on_d[i]
            others = [x for j, x in on_d.items() if j != i and (x[0] <= begun < x[1] or x[0] <= ended < x[1])]
            ratios["local_ttft"].append(t["ttft"] / priced[i][1])
            if others and quiet_only:
                continue
            steps = rates.steps(n, d_hit, block)
            online.observe_prefill(n - d_hit, d_hit, steps, t["ttft"] - steps * rates.step_ms_per_seq * t["streams"])
            continue
        begun, answered, tokens = on_p[i]
        ratios["remote_ttft"].append(t["ttft"] / priced[i][1])
        if not any(b < answered and a > begun for j, (b, a, _) in on_p.items() if j != i):  # P ran it alone
            end = n - remote_tail(n, block, t["choice"])
            online.observe_prefill(max(end - p_hit, 1), p_hit, rates.steps(end, p_hit, block), t["p_ms"])
        if quiet_only and any(b <= x < a for b, a, _ in on_d.values() for x in (answered, now)):
            continue  # D had a prompt of its own to compute when the pulled turn reached it, or at its first token
        end = n - remote_tail(n, block, t["choice"])
        read = ((end - min(d_hit, end)) * rates.kv_mb_per_token + rates.checkpoint_mb) * rates.read_ms_per_mb
        tail_ms = decoder_tail_ms(rates, n, n - end)
        online.observe_hop(t["ttft"] - t["p_ms"] - read - rates.step(t["streams"] + 1) - tail_ms)
    return {"ratios": ratios, "rates": online.rates}


def report(folders: list[Path], block: int, align_split: bool = True) -> str:
    out = ["| run | learning | P's call measured / priced | remote TTFT measured / predicted | D alone | "
           "remote / D alone | prefill step ms | ms a 1k tokens | hop ms | f |", "|---" * 10 + "|"]
    for folder in folders:
        lines = proxy_lines(folder / "hybrid-pd-1p1d-logs.tar.gz")
        for way in WAYS:
            if way == "as run":
                got = replay(lines, block, quiet_only=False, align_split=align_split)
            else:
                with mock.patch.object(cost_model, "d_queue_ms", steps_d_queue_ms):
                    got = replay(lines, block, quiet_only=True, align_split=align_split)
            ratios = got["ratios"]
            med = {k: f"{statistics.median(v):.2f} ({len(v)})" if v else "-" for k, v in ratios.items()}
            bias = (f"{statistics.median(ratios['remote_ttft']) / statistics.median(ratios['local_ttft']):.2f}"
                    if ratios["remote_ttft"] and ratios["local_ttft"] else "-")  # < 1: remote overpriced against D
            r = got["rates"]
            out.append(f"| {folder.name} | {way} | {med['p_call']} | {med['remote_ttft']} | {med['local_ttft']} | "
                       f"{bias} | "
                       f"{r.prefill_step_ms:.1f} | {r.prefill_ms_per_token * 1000:.1f} | {r.hop_ms:.1f} | "
                       f"{r.prefiller_call_factor:.2f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", type=Path, nargs="+")
    ap.add_argument("--block", type=int, default=544, help="the run's aligned block (Qwen3-Next shape: 544)")
    ap.add_argument("--no-align-split", dest="align_split", action="store_false",
                    help="the run's proxy priced no align-mode split (its default since 2026-11-27: vLLM 0.32+)")
    args = ap.parse_args(argv)
    sys.stdout.write(report(args.folders, args.block, args.align_split))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
