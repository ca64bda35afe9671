"""The judged ratios: our default set-up (hybrid-pd-1p1d) against its peers of the same run, from the parts alone.

merge.py adds them to results.json's `ratios` (and what each rests on to `ratio_basis`):

    worst_vs_upstream           the largest, over every (workload, length, concurrency) cell both ran, of our TTFT
                                p50 / upstream's, our TTFT p90 / upstream's and upstream's output tok/s / ours
    goodput_vs_upstream         our goodput / upstream's; goodput: completed turns per second whose TTFT is within
    goodput_vs_best_peer        TTFT_SLO_MS and whose ITL p90 within ITL_SLO_MS, pooled over the headline length's
                                agentic runs (good turns of every concurrency / their wall seconds); the best peer is
                                the best of upstream and the peer-policy variants (PEERS)
    dlocal_share_vs_oracle_c1   the share of c=1 turns we served on the decoder alone over the hindsight oracle's:
                                the turns on which serving on D alone was the cheaper path (see `oracle_local`)
    hybrid_misroutes            turns served on D alone while D held attention blocks past its usable checkpoint
                                (see `misroutes`: what the parts can tell of it, and what they cannot)

The variants' prompts are salted (their own prompts): they are compared by aggregates only, never row by row.
"""

from __future__ import annotations

OURS = "hybrid-pd-1p1d"
UPSTREAM, COLOCATED = "upstream", "colocated"
PEERS = (UPSTREAM, OURS + "-isl-bounding", OURS + "-non-cached-tokens")  # Dynamo's decider, llm-d's decider

# The goodput SLO, from the colocated floor (one engine, no PD) of the run this was written for,
# benchmarks/results/2026-11-26-h100-qwen3next-judged-vllm033 (one H100, agentic, 8k prompts):
# - TTFT: 4x its c=1 TTFT p90 (123.6 ms), rounded: a turn may queue behind about three others' prefills, which one
#   engine does at c=8 (its c=8 TTFT p90: 361.5 ms, within), but not behind a c=32 backlog (its c=32 p50: 945 ms).
TTFT_SLO_MS = 500.0
# - ITL: about 10 of its decode steps (ITL p50 4.6 ms at c=1, 6.5 ms at c=8). A turn's ITL p90 is over the gaps between
#   the stream's text pieces, and a gap spans several tokens where some decode to no text: colocated's turns reach
#   at most 21.7 ms at c=1 and 39.4 ms at c=8, all within; a stream held behind an engine step that prefills a long
#   prompt is not (the warm-up's 8,192-token prefill alone took 98-164 ms: hybrid-pd-1p1d-driver.txt).
ITL_SLO_MS = 50.0


def pct(values, q: float):
    """merge.py's percentile: the value at index int(q * n) of the sorted values (None of none)."""
    values = sorted(v for v in values if v is not None)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def row_itl_p90_ms(row: dict) -> float | None:
    """A turn's ITL p90: over its gaps (ms) where the part has them, else its median gap (itl_s); None for a turn
    whose answer came in one piece."""
    if row.get("gaps_ms"):
        return pct(row["gaps_ms"], 0.9)
    return row["itl_s"] * 1e3 if row.get("itl_s") is not None else None


def good(row: dict, ttft_ms: float = TTFT_SLO_MS, itl_ms: float = ITL_SLO_MS) -> bool:
    """A completed turn within the SLO: TTFT and ITL p90 (a turn with no gap has none to miss)."""
    if row.get("ttft_s") is None:
        return False
    itl = row_itl_p90_ms(row)
    return row["ttft_s"] * 1e3 <= ttft_ms and (itl is None or itl <= itl_ms)


def goodput(part: dict, workload: str, length: int) -> dict:
    """Good turns per second of `part`'s runs of `workload` at `length`: per concurrency and pooled ("all": every
    such run's good turns over their wall seconds together)."""
    out, good_n, wall = {}, 0, 0.0
    for run in part.get("runs", []):
        if run["workload"] == workload and run["length"] == length and run.get("wall_s"):
            n = sum(good(r) for r in run["rows"])
            out[run["concurrency"]] = n / run["wall_s"]
            good_n, wall = good_n + n, wall + run["wall_s"]
    if wall:
        out["all"] = good_n / wall
    return out


def worst_vs(tables: dict, ours: str, peer: str) -> tuple[float | None, str | None]:
    """The largest of our TTFT p50 and p90 over the peer's, and of the peer's tok/s over ours, over every
    (workload, length, concurrency) cell of `tables` ((workload, length, c, set-up) -> merge.summarize's row) that
    both ran; with the cell and figure it came from."""
    worst, where = None, None
    for (wl, length, conc, setup), mine in sorted(tables.items()):
        theirs = tables.get((wl, length, conc, peer))
        if setup != ours or theirs is None:
            continue
        for name, a, b in (("ttft_p50", mine["ttft_p50_ms"], theirs["ttft_p50_ms"]),
                           ("ttft_p90", mine["ttft_p90_ms"], theirs["ttft_p90_ms"]),
                           ("tok_s", theirs["tok_s"], mine["tok_s"])):
            if a is not None and b and (worst is None or a / b > worst):
                worst, where = a / b, f"{wl} {length} c={conc} {name}"
    return worst, where


def key(row: dict) -> tuple:
    """A turn's identity across set-ups of the same prompts (merge.key)."""
    return (row["workload"], row["length"], row["concurrency"], row["session"], row["turn"], row["prompt_tokens"])


def oracle_local(colocated: dict, upstream: dict, concurrency: int = 1) -> dict[tuple, bool]:
    """The hindsight oracle, per turn at `concurrency` that both set-ups ran: True where serving the turn on D alone
    was cheaper than the remote path. D alone's TTFT is estimated by the colocated engine's TTFT on the same
    (session, turn) prompt: the same computation (one engine, its own prefix cache of the session's earlier turns,
    nothing else running at c=1); the remote path's by upstream's TTFT on the same turn (P prefills, D pulls, D
    answers). Only meaningful where nothing else runs: at c=1 neither engine queues behind other turns."""
    remote = {key(r): r["ttft_s"] for run in upstream.get("runs", []) for r in run["rows"]
              if r["concurrency"] == concurrency and r.get("ttft_s") is not None}
    return {key(r): r["ttft_s"] < remote[key(r)] for run in colocated.get("runs", []) for r in run["rows"]
            if r["concurrency"] == concurrency and r.get("ttft_s") is not None and key(r) in remote}


def dlocal_vs_oracle(ours: dict, oracle: dict[tuple, bool], concurrency: int = 1) -> dict:
    """Our share of turns served on D alone (usage.hybrid_pd.computed_on == "decode") over the oracle's, on the turns
    the oracle judged; with both shares and how many turns our choice matched the oracle's."""
    rows = [r for run in ours.get("runs", []) for r in run["rows"] if r["concurrency"] == concurrency
            and key(r) in oracle]
    if not rows:
        return {"ratio": None, "turns": 0}
    local = [r.get("computed_on") == "decode" for r in rows]
    share, oracle_share = sum(local) / len(rows), sum(oracle[key(r)] for r in rows) / len(rows)
    return {"ratio": share / oracle_share if oracle_share else None, "turns": len(rows), "share": share,
            "oracle_share": oracle_share, "agree": sum(x == oracle[key(r)] for x, r in zip(local, rows))}


def misroutes(part: dict, colocated: dict | None = None) -> dict:
    """Hybrid misroutes as far as the parts can tell them: turns served on D alone whose hit (the engine's reported
    cached tokens: attention blocks AND a checkpoint at that boundary) fell short of the attention prefix D held,
    with the tokens D recomputed for it.

    What the parts cannot tell: which attention blocks D held (no per-worker block list is recorded; the proxy's
    own hybrid_misroutes counter is not in the parts), nor what the decider believed. They stand in for D's
    attention prefix with the row's oracle hit: the longest aligned prefix the prompt shares with an earlier prompt
    of the workload. Every turn of a PD set-up is decoded on D, so D computed or pulled every earlier prompt's
    blocks; with no eviction (an assumption: the parts carry no KV usage) D held at least that prefix. The oracle
    also counts prefixes of other sessions sent later at c > 1, so this is an upper bound. Remote turns are not
    counted: what P held is not in the parts either. With `colocated` (same prompts), `inherent` counts those of
    the turns on which the colocated engine, which had seen every earlier prompt, reused no more: no placement
    could have found a checkpoint there."""
    ref = {key(r): r["hit_tokens"] for run in (colocated or {}).get("runs", []) for r in run["rows"]}
    short = [r for run in part.get("runs", []) for r in run["rows"]
             if r.get("computed_on") == "decode" and r["hit_tokens"] < r["oracle_hit"]]
    return {"turns": len(short), "recomputed_tokens": sum(r["oracle_hit"] - r["hit_tokens"] for r in short),
            "inherent": sum(key(r) in ref and ref[key(r)] <= r["hit_tokens"] for r in short) if ref else None}


def judged(parts: dict, tables: dict, headline: int, workload: str = "agentic") -> tuple[dict, dict]:
    """(ratios, basis) over `parts` (set-up name -> part; variants named set-up + tag) and merge's `tables`."""
    ours, col, up = parts.get(OURS, {}), parts.get(COLOCATED, {}), parts.get(UPSTREAM, {})
    worst, where = worst_vs(tables, OURS, UPSTREAM)
    variants = sorted(n for n in parts if n.startswith(OURS + "-") and n not in PEERS)  # ours' A/Bs: shown, no peer
    rates = {name: goodput(parts[name], workload, headline)
             for name in (OURS, COLOCATED, *PEERS, *variants) if name in parts}
    pooled = {name: r.get("all") for name, r in rates.items()}
    peers = {name: v for name, v in pooled.items() if name in PEERS and v is not None}  # the floor is no peer
    best = max(peers, key=peers.__getitem__) if peers else None
    mine = pooled.get(OURS)
    dlocal = dlocal_vs_oracle(ours, oracle_local(col, up)) if col and up else {"ratio": None, "turns": 0}
    wrong = misroutes(ours, col) if ours else {}
    ratios = {
        "worst_vs_upstream": worst,
        "goodput_vs_upstream": mine / pooled[UPSTREAM] if mine is not None and pooled.get(UPSTREAM) else None,
        "goodput_vs_best_peer": mine / peers[best] if mine is not None and best and peers[best] else None,
        "dlocal_share_vs_oracle_c1": dlocal["ratio"],
        "hybrid_misroutes": wrong.get("turns"),
        # of them, those on which the colocated engine (every earlier prompt seen) reused more: where a checkpoint
        # could have been found (the rest no placement could have served better)
        "hybrid_misroutes_avoidable": (wrong["turns"] - wrong["inherent"]
                                       if wrong.get("inherent") is not None else None),
    }
    basis = {"worst_vs_upstream_cell": where, "slo": {"ttft_ms": TTFT_SLO_MS, "itl_p90_ms": ITL_SLO_MS},
             "goodput_turns_per_s": rates, "best_peer": best, "dlocal_c1": dlocal,
             "hybrid_misroutes": {name: misroutes(p, col if not p.get("tag") else None) for name, p in parts.items()
                                  if name == OURS or name in PEERS[1:] or name in variants}}
    return ratios, basis



def basis_md(basis: dict) -> list[str]:
    """summary.md's lines for what the judged ratios rest on (results.json's `ratio_basis.judged`)."""
    if not basis:
        return []
    slo, dl, rates = basis["slo"], basis["dlocal_c1"], basis["goodput_turns_per_s"]
    concs = sorted({c for r in rates.values() for c in r} - {"all"}, key=int)
    show = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["", f"Judged ratios' basis (benchmarks/gpu/judged.py): goodput counts the turns with TTFT <= "
             f"{slo['ttft_ms']:.0f} ms and ITL p90 <= {slo['itl_p90_ms']:.0f} ms; best peer {basis['best_peer']}; "
             f"worst_vs_upstream from {basis['worst_vs_upstream_cell']}; at c=1 D alone served "
             f"{show(dl.get('share'))} of {dl['turns']} turns, the oracle's share {show(dl.get('oracle_share'))}, "
             f"{dl.get('agree', '-')} turns as the oracle chose. Hybrid misroutes: turns on D alone whose hit fell "
             "short of the attention prefix D held (an upper bound: the parts hold no per-worker blocks).", "",
             "| set-up | goodput turns/s (pooled) | " + " | ".join(f"c={c}" for c in concs)
             + " | hybrid misroutes | tokens recomputed | of them missed by colocated too |",
             "|---" * (5 + len(concs)) + "|"]
    for name, r in rates.items():
        m = basis["hybrid_misroutes"].get(name) or {}
        wrong = " | ".join("-" if m.get(k) is None else str(m[k]) for k in ("turns", "recomputed_tokens", "inherent"))
        each = " | ".join(show(r.get(c)) for c in concs)
        lines.append(f"| {name} | {show(r.get('all'))} | {each} | {wrong} |")
    return lines
