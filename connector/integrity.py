"""KV integrity, the pure part: which blocks P digests, which landed blocks D checks, and the comparison.

P digests every real block (not vLLM's null placeholder) of a request's per-group block lists after the
step in which its prompt completes, and ships the digests in kv_transfer_params (`messages.BlockDigests`,
one `GroupDigests` per TP rank and group). D, once a READ has landed and before it reports the load done,
digests the local blocks of the plan's (local, remote) pairs, all of them or a sample, and compares each with
P's digest of the remote block; any difference fails the load (vLLM recomputes the request). The torch
hashing lives in kv_digest.py.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence

from hybrid_pd.connector.errors import DigestMismatch
from hybrid_pd.connector.messages import BlockDigests, GroupDigests
from hybrid_pd.connector.plan import NULL_BLOCK, TransferPlan

# (group, block ids) pairs -> each pair's digests, computed on this worker together (kv_digest.digest_many: one
# read back to the host for all of them)
DigestFn = Callable[[Sequence[tuple[int, Sequence[int]]]], list[list[int]]]


def digest_targets(block_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """P: the blocks to digest per group: every real block once, in list order."""
    return [list(dict.fromkeys(b for b in ids if b != NULL_BLOCK)) for ids in block_ids]


def digest_requests(todo: Mapping[str, Sequence[Sequence[int]]], digest: DigestFn) -> dict[str, list[GroupDigests]]:
    """P: this worker's digests of each request's targets (from digest_targets), every request and group of
    the step in one `digest` call."""
    items = [(req_id, g, list(ids)) for req_id, targets in todo.items() for g, ids in enumerate(targets)]
    out: dict[str, list[GroupDigests]] = {req_id: [] for req_id in todo}
    for (req_id, _, ids), values in zip(items, digest([(g, ids) for _, g, ids in items]) if items else []):
        out[req_id].append(GroupDigests(ids, values))
    return out


def pairs_to_verify(plan: TransferPlan, fraction: float, request_id: str) -> list[tuple[int, int, int]]:
    """D: the (group, local, remote) blocks to check: all of them at fraction 1, else ceil(fraction * n) drawn
    per request (seeded by its id, so a rerun checks the same ones), at least one while fraction > 0."""
    pairs = [(r.group, local, remote) for r in plan.runs for local, remote in r.pairs]
    if fraction >= 1 or not pairs:
        return pairs
    if fraction <= 0:
        return []
    k = max(1, math.ceil(fraction * len(pairs)))
    return sorted(random.Random(request_id).sample(pairs, k))


def verify(
    expected: BlockDigests,
    algorithm: str,
    rank: int,
    pairs: Sequence[tuple[int, int, int]],
    digest: DigestFn,
    request_id: str,
) -> int:
    """D: digest the landed local blocks of `pairs` and compare with P's digests of their remote blocks; return
    how many were checked (pairs P sent no digest for are not). Raises DigestMismatch naming the first few."""
    if expected.algorithm != algorithm:
        raise DigestMismatch(f"request {request_id}: P digests with {expected.algorithm}, this decoder {algorithm}")
    theirs = expected.of_rank(rank)
    by_group: dict[int, list[tuple[int, int, int]]] = {}
    for g, local, remote in pairs:
        if remote in theirs.get(g, {}):
            by_group.setdefault(g, []).append((local, remote, theirs[g][remote]))
    bad, groups = [], list(by_group.items())
    landed = digest([(g, [local for local, _, _ in items]) for g, items in groups]) if groups else []
    for (g, items), ours in zip(groups, landed):
        bad += [(g, local, remote) for (local, remote, want), got in zip(items, ours) if got != want]
    if bad:
        raise DigestMismatch(
            f"request {request_id}: {len(bad)} of {sum(map(len, by_group.values()))} checked blocks differ from the "
            f"prefiller's digests (group, local, remote: {bad[:4]}); the load is failed and recomputed"
        )
    return sum(map(len, by_group.values()))
