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
from typing import Protocol

from hybrid_pd.connector.errors import DigestMismatch
from hybrid_pd.connector.messages import BlockDigests, GroupDigests
from hybrid_pd.connector.plan import NULL_BLOCK, TransferPlan


class Pending(Protocol):
    """Digests on their way to the host (kv_digest.PendingDigests): `ready()` when `result()` would not wait."""

    def ready(self) -> bool: ...

    def result(self) -> list[list[int]]: ...


# (group, block ids) pairs -> each pair's digests, queued on this worker together (one read back for all)
DigestFn = Callable[[Sequence[tuple[int, Sequence[int]]]], Pending]


class Computed:
    """Digests already on the host: a Pending that never waits."""

    def __init__(self, values: list[list[int]]):
        self.values = values

    def ready(self) -> bool:
        return True

    def result(self) -> list[list[int]]:
        return self.values


def digest_targets(block_ids: Sequence[Sequence[int]]) -> list[list[int]]:
    """P: the blocks to digest per group: every real block once, in list order."""
    return [list(dict.fromkeys(b for b in ids if b != NULL_BLOCK)) for ids in block_ids]


class RequestDigests:
    """P: the digests of the requests whose prompt completed in a step, every group of every request queued in
    one `digest` call after the step's forward pass; `result()` (request id -> its groups' digests) reads them
    when the scheduler takes the step's output, not inside the step."""

    def __init__(self, todo: Mapping[str, Sequence[Sequence[int]]], digest: DigestFn):
        self._items = [(req_id, list(ids)) for req_id, targets in todo.items() for ids in targets]
        self._requests = list(todo)
        self._pending = digest([(g, ids) for req_id, targets in todo.items() for g, ids in enumerate(targets)])

    def result(self) -> dict[str, list[GroupDigests]]:
        out: dict[str, list[GroupDigests]] = {req_id: [] for req_id in self._requests}
        for (req_id, ids), values in zip(self._items, self._pending.result()):
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


class Check:
    """D: a landed READ's blocks against P's digests, started (start_check); `ready()` once the local digests are
    back, `finish()` then compares: how many blocks were checked, or DigestMismatch naming the first few."""

    def __init__(self, request_id: str, groups: list[tuple[int, list[tuple[int, int, int]]]], landed: Pending):
        self.request_id, self._groups, self._landed = request_id, groups, landed

    def ready(self) -> bool:
        return self._landed.ready()

    def finish(self) -> int:
        bad = []
        for (g, items), ours in zip(self._groups, self._landed.result()):
            bad += [(g, local, remote) for (local, remote, want), got in zip(items, ours) if got != want]
        checked = sum(len(items) for _, items in self._groups)
        if bad:
            raise DigestMismatch(
                f"request {self.request_id}: {len(bad)} of {checked} checked blocks differ from the prefiller's "
                f"digests (group, local, remote: {bad[:4]}); the load is failed and recomputed"
            )
        return checked


def start_check(
    expected: BlockDigests,
    algorithm: str,
    rank: int,
    pairs: Sequence[tuple[int, int, int]],
    digest: DigestFn,
    request_id: str,
) -> Check:
    """D: queue the digests of the landed local blocks of `pairs` that P sent a digest for (their remote
    blocks'); the Check compares them once they are back. Raises DigestMismatch at once for another algorithm."""
    if expected.algorithm != algorithm:
        raise DigestMismatch(f"request {request_id}: P digests with {expected.algorithm}, this decoder {algorithm}")
    theirs = expected.of_rank(rank)
    by_group: dict[int, list[tuple[int, int, int]]] = {}
    for g, local, remote in pairs:
        if remote in theirs.get(g, {}):
            by_group.setdefault(g, []).append((local, remote, theirs[g][remote]))
    groups = list(by_group.items())
    landed = digest([(g, [local for local, _, _ in items]) for g, items in groups]) if groups else Computed([])
    return Check(request_id, groups, landed)
