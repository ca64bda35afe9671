"""The routing index at fleet scale: the per-worker index it replaced (tests/proxy/kv_index_oracle.py, "before")
against the fleet index (proxy/kv/index.py, "after"), on one synthetic fleet (kv_index_workload.py).

    bash deploy/dev.sh run python -m benchmarks.kv_index_bench [--workers 16,64,256] [--blocks-per-worker N]
        [--decisions 300] [--no-memory] [--out benchmarks/results/<date>-cpu-kv-index]

Per fleet size, single-threaded, CPU time of this thread (time.thread_time):
- start-up: every worker's whole cache announced (BlockStored batches) into an empty index: CPU seconds, and
  block events ingested per CPU second (one core); removals the same way (one worker's cache evicted); and
  decode+apply, msgpack frames as the subscriber receives them;
- a routing decision for an 8.7k-token probe that continues a session one worker holds, hashing included:
  before = the prompt's hashes (the code of the time: one pickle and one sha256 per block) and the per-worker
  usable hit of every worker, the kv_hit score of each; after = Router.pick with the kv_hit scorer over every
  worker (hashing, one pass, scores, picker). A "new session" probe (system prompt + 6.7k new tokens) too. Both
  must find the holder (asserted);
- memory (tracemalloc: bytes the index holds after start-up) per indexed (block, group, worker) entry, for the
  fleet itself and for a fleet where no block is shared and one where every block is.
Writes results.json and summary.md (command, machine, commit, tables) into --out.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import pickle
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from benchmarks.kv_index_workload import (
    BLOCK,
    CHECKPOINT,
    NEW,
    SESSION,
    SYSTEM,
    VOCAB,
    Fleet,
    block_events,
)
from hybrid_pd.proxy.config.sections import KVIndexConfig, Policy
from hybrid_pd.proxy.kv.block_hash import none_hash
from hybrid_pd.proxy.kv.events import BlockStored, KVEventBatch, decode_frames, encode_frames
from hybrid_pd.proxy.kv.index import KVIndex
from hybrid_pd.proxy.kv.prompt_keys import ChainCache
from hybrid_pd.proxy.routing import Deps, RequestContext, Router
from hybrid_pd.proxy.workers import Worker
from tests.proxy.kv_index_oracle import KVIndex as OldIndex

Index = KVIndex | OldIndex


def old_chained_block_hashes(token_ids: list[int], h: int, seed: str = "vllm-none-hash") -> list[bytes]:
    """The proxy's prompt hashing before the fleet index (sha256, no salt), for the "before" decisions."""
    parent, out = none_hash("sha256", seed), []
    for start in range(0, len(token_ids) - h + 1, h):
        parent = hashlib.sha256(
            pickle.dumps((parent, tuple(token_ids[start : start + h]), None), protocol=pickle.HIGHEST_PROTOCOL)
        ).digest()
        out.append(parent)
    return out


def cpu(fn: Callable[[], object]) -> tuple[float, object]:
    t = time.thread_time()
    out = fn()
    return time.thread_time() - t, out


def ingest(fleet: Fleet, make: Callable[[], Index]) -> tuple[Index, float, int]:
    """Every worker's cache into a fresh index: (index, CPU seconds in apply, block events)."""
    index, seconds, events = make(), 0.0, 0
    for w in range(fleet.workers):
        batches = list(fleet.batches(w))
        url = fleet.url(w)
        t = time.thread_time()
        for b in batches:
            index.apply(url, b)
        seconds += time.thread_time() - t
        events += sum(map(block_events, batches))
    return index, seconds, events


def removal_rate(fleet: Fleet, index: Index) -> float:
    """Block events per CPU second evicting worker 0's whole cache (then announcing it again)."""
    removes, stores = list(fleet.batches(0, remove=True)), list(fleet.batches(0))
    seconds, _ = cpu(lambda: [index.apply(fleet.url(0), b) for b in removes])
    for b in stores:
        index.apply(fleet.url(0), b)
    return sum(map(block_events, removes)) / seconds


def decode_apply_rate(fleet: Fleet, make: Callable[[], Index]) -> float:
    """Block events per CPU second from msgpack frames (the subscriber's work) into a fresh index."""
    workers = range(min(4, fleet.workers))
    frames = [(fleet.url(w), encode_frames(b, i)) for w in workers for i, b in enumerate(fleet.batches(w))]
    index = make()

    def run() -> int:
        n = 0
        for url, f in frames:
            _, batch = decode_frames(f)
            index.apply(url, batch)
            n += block_events(batch)
        return n

    seconds, n = cpu(run)
    return int(n) / seconds  # type: ignore[call-overload]


def percentiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"p50": statistics.median(xs), "p99": xs[min(len(xs) - 1, int(0.99 * len(xs)))], "n": len(xs)}


def decide_before(old: OldIndex, urls: list[str], tokens: list[int]) -> str:
    cache: dict[int, list[bytes]] = {}

    def hashes_for(h: int) -> list[bytes]:
        if h not in cache:
            cache[h] = old_chained_block_hashes(tokens, h)
        return cache[h]

    n = len(tokens)
    scores = [min(1.0, old.hit_tokens(u, n, hashes_for) / n) for u in urls]
    return urls[scores.index(max(scores))]


def decisions(fleet: Fleet, old: OldIndex | None, new: KVIndex, count: int) -> dict:
    """CPU ms per decision. after_cold: the proxy's chain cache empty (every block hashed); after_warm: the
    session's previous turn (its 8k tokens) went through this proxy before, so only the new 512 tokens are
    hashed, as for an agent's next turn. Every probe's new tokens are drawn afresh."""
    urls = [fleet.url(w) for w in range(fleet.workers)]
    workers = [Worker(u, "decode") for u in urls]
    router = Router("decode", Policy((("kv_hit", 1.0),), "first"), Deps(new, KVIndexConfig()))
    rng = random.Random(1)
    shared = ChainCache()
    out: dict = {}
    for name in ("continuation", "new_session"):
        times: dict[str, list[float]] = {"before": [], "after_cold": [], "after_warm": []}
        for i in range(count):
            holder, probe = fleet.probes[i % len(fleet.probes)]
            if name == "continuation":
                seen = probe[:SESSION]
                tokens = seen + [rng.randrange(VOCAB) for _ in range(NEW)]
            else:
                holder, seen = None, fleet.system
                tokens = seen + [rng.randrange(VOCAB) for _ in range(SESSION - SYSTEM + NEW)]
            router.pick(RequestContext(token_ids=seen, hash_cache=shared), workers)  # the previous turn
            for kind, cache in (("after_cold", ChainCache()), ("after_warm", shared)):
                ctx = RequestContext(token_ids=tokens, hash_cache=cache)
                gc.disable()
                dt, picked = cpu(lambda ctx=ctx: router.pick(ctx, workers))
                gc.enable()
                times[kind].append(dt * 1e3)
                if holder is not None:
                    assert picked.url == urls[holder] and ctx.hits[urls[holder]] == SESSION, (picked.url, ctx.hits)
            if old is not None and i < max(20, count // 5):
                gc.disable()
                dt, best = cpu(lambda tokens=tokens: decide_before(old, urls, tokens))
                gc.enable()
                times["before"].append(dt * 1e3)
                if holder is not None:
                    assert best == urls[holder]
        out[name] = {f"{k}_ms": percentiles(v) for k, v in times.items() if v}
    return out


def hashing(fleet: Fleet) -> dict:
    """ms to hash one probe: the old loop, ours (all of it, as a decision that must hash it all), vLLM's own."""
    from hybrid_pd.proxy.kv.prompt_keys import PromptKeys

    tokens = fleet.probes[0][1]
    rows = {
        "before": lambda: old_chained_block_hashes(tokens, BLOCK),
        "after": lambda: PromptKeys(tokens, BLOCK).upto(len(tokens)),
    }
    try:
        from vllm.utils.hashing import sha256 as vllm_sha256
        from vllm.v1.core import kv_cache_utils as vk

        vk.init_none_hash(vllm_sha256)

        def vllm_loop() -> None:
            parent = None
            for s in range(0, len(tokens) - BLOCK + 1, BLOCK):
                parent = vk.hash_block_tokens(vllm_sha256, parent, tokens[s : s + BLOCK], None)

        rows["vllm"] = vllm_loop
    except ImportError:
        pass
    return {k: statistics.median(cpu(fn)[0] * 1e3 for _ in range(30)) for k, fn in rows.items()}


def traced_bytes(build: Callable[[], object]) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    kept = build()
    gc.collect()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return size, kept


def entries_of(index: Index) -> int:
    if isinstance(index, KVIndex):
        return index.entries()
    return sum(len(s) for w in index.workers.values() for s in w.hashes.values())


def memory(fleet: Fleet, with_old: bool) -> dict:
    """Bytes per (block, group, worker) entry: the fleet's index, and the two extremes of sharing."""
    out = {}
    makers: dict[str, Callable[[], Index]] = {"after": KVIndex} | ({"before": OldIndex} if with_old else {})
    for name, make in makers.items():
        size, index = traced_bytes(lambda make=make: ingest(fleet, make)[0])
        out[f"fleet_{name}"] = size / entries_of(index)  # type: ignore[arg-type]
        del index
        for shared in (False, True):
            size, index = traced_bytes(lambda make=make, shared=shared: extreme(make, fleet.workers, shared))
            out[f"{'shared' if shared else 'unshared'}_{name}"] = size / entries_of(index)  # type: ignore[arg-type]
            del index
    return out


def extreme(make: Callable[[], Index], workers: int, shared: bool, blocks: int = 4096) -> Index:
    """`workers` each holding `blocks` attention blocks and their checkpoints: all the same ones or all their own."""
    index, rng = make(), random.Random(7)
    common = [rng.randbytes(32) for _ in range(blocks)]
    per = CHECKPOINT // BLOCK
    for w in range(workers):
        hashes = [bytes(bytearray(h)) for h in common] if shared else [rng.randbytes(32) for _ in range(blocks)]
        events = []
        for s in range(0, blocks, per):
            events.append(BlockStored(hashes[s : s + per], None, [], BLOCK, medium="GPU", group_idx=0,
                                      kv_cache_spec_kind="full_attention"))
            events.append(BlockStored(hashes[s + per - 1 : s + per], None, [], CHECKPOINT, medium="GPU",
                                      group_idx=1, kv_cache_spec_kind="mamba"))
        index.apply(f"http://w{w}:8000", KVEventBatch(0.0, events))
    return index


def run_size(workers: int, args: argparse.Namespace) -> dict:
    fleet = Fleet(workers, blocks_per_worker=args.blocks_per_worker)
    row: dict = {"workers": workers}
    new, seconds, events = ingest(fleet, KVIndex)
    assert isinstance(new, KVIndex)
    row |= {"block_events": events, "entries": new.entries(), "startup_after_s": seconds,
            "ingest_after_per_s": events / seconds, "remove_after_per_s": removal_rate(fleet, new),
            "decode_apply_after_per_s": decode_apply_rate(fleet, KVIndex)}
    old = None
    if not args.no_before:
        old_index, seconds, _ = ingest(fleet, OldIndex)
        assert isinstance(old_index, OldIndex)
        old = old_index
        row |= {"startup_before_s": seconds, "ingest_before_per_s": events / seconds,
                "remove_before_per_s": removal_rate(fleet, old),
                "decode_apply_before_per_s": decode_apply_rate(fleet, OldIndex)}
    row["decisions"] = decisions(fleet, old, new, args.decisions)
    row["hashing_ms"] = hashing(fleet)
    del old, new
    gc.collect()
    if not args.no_memory:
        row["bytes_per_entry"] = memory(fleet, not args.no_before)
    print(json.dumps(row), flush=True)
    return row


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(x.split(":", 1)[1].strip() for x in lines if x.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "?"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="16,64,256")
    ap.add_argument("--blocks-per-worker", type=int, default=0, help="0: 16-64 sessions of 8k tokens per worker")
    ap.add_argument("--decisions", type=int, default=300)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--no-before", action="store_true", help="skip the per-worker index (large fleets)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    rows = [run_size(int(w), args) for w in args.workers.split(",")]
    if args.out:
        from benchmarks.kv_index_report import write_summary

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        meta = {"command": "bash deploy/dev.sh run python -m benchmarks.kv_index_bench " + shlex.join(sys.argv[1:]),
                "machine": f"{platform.machine()}, {_cpu_model()}, {os.cpu_count()} cores, "
                f"Python {platform.python_version()}",
                "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                         check=False).stdout.strip(),
                "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        path = out / (f"results-{args.blocks_per_worker}.json" if args.blocks_per_worker else "results.json")
        if path.exists():  # runs of other fleet sizes (say, 256 workers without "before") stay
            earlier = json.loads(path.read_text())
            sizes = {r["workers"] for r in rows}
            rows = sorted([r for r in earlier["rows"] if r["workers"] not in sizes] + rows, key=lambda r: r["workers"])
            meta["command"] = earlier["meta"]["command"] + "; " + meta["command"]
        path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        write_summary(out)


if __name__ == "__main__":
    main()
