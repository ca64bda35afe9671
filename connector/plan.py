"""The transfer plan: which blocks decode (D) reads from prefill (P), as a pure function.

Block layout of one request in align mode (block size `bs`; P computed `n` prompt tokens: the last block
boundary below N, or N - 1 where P does not stop at a boundary, as drawn here; D has a
local prefix hit of `h` tokens; `0` is vLLM's null placeholder block):

    token:            0        bs       2bs      3bs   n
                      |--------|--------|--------|-----|
    attention  P:     [  a0    ,  a1    ,  a2    ,  a3 ]     every block holds KV of its tokens
    attention  D:     [  d0    ,  d1    ,  e2    ,  e3 ]     d0,d1: D's own prefix hit (h = 2bs): NOT moved
                                          ^^^^^^^^^^^^^      e2 <- a2, e3 <- a3 (one run: adjacent ids)
    mamba      P:     [  0     ,  0     ,  0     ,  s  ]     s = running state after n tokens, at
    mamba      D:     [  c0    ,  0     ,  0     ,  t  ]     index cdiv(n, bs) - 1; 0 = placeholder
                                                    t <- s   (dropped placeholders are never moved)
    checkpoint P:      aligned state after 3bs tokens (cached on P, not in the request's list): k
    checkpoint D:      a spare block u, registered in D's prefix cache for boundary 3bs: u <- k

A Mamba group moves only the state D resumes from (plus, if given, the checkpoint at the last block boundary
P holds, when that boundary lies past D's hit and at most at `n`: at `n` where P stopped at a junction, for D
to keep as a checkpoint of its own while its request goes on from the same state). An attention group moves the blocks
from D's hit up to `n`. Reads whose local and remote ids both ascend by one are coalesced into one `Run`,
which the transport turns into one descriptor per layer region when the region's blocks abut.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Literal

from hybrid_pd.connector.errors import PlanError

GroupKind = Literal["attention", "mamba"]
NULL_BLOCK = 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass(frozen=True)
class GroupSpec:
    kind: GroupKind
    block_size: int


@dataclasses.dataclass(frozen=True)
class Run:
    """`count` blocks read from remote ids `remote_start..` into local ids `local_start..` of one group."""

    group: int
    local_start: int
    remote_start: int
    count: int = 1

    @property
    def pairs(self) -> list[tuple[int, int]]:
        return [(self.local_start + i, self.remote_start + i) for i in range(self.count)]


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """An aligned Mamba state of P (`remote_block`) for the boundary `tokens`, to land in `local_block`."""

    group: int
    remote_block: int
    local_block: int
    tokens: int


@dataclasses.dataclass(frozen=True)
class TransferPlan:
    runs: tuple[Run, ...]
    num_tokens: int  # prompt tokens valid on D once every run has landed
    checkpoints: tuple[Checkpoint, ...] = ()  # also present in `runs`
    skipped_local: int = 0  # attention blocks D already held
    dropped_placeholders: int = 0  # null Mamba blocks in P's lists that were not moved

    @property
    def num_blocks(self) -> int:
        return sum(r.count for r in self.runs)

    def blocks_of(self, group: int) -> list[tuple[int, int]]:
        return [p for r in self.runs if r.group == group for p in r.pairs]


def coalesce(group: int, pairs: Sequence[tuple[int, int]]) -> list[Run]:
    """Merge (local, remote) pairs, in order, into runs where both ids ascend by one."""
    runs: list[Run] = []
    for local, remote in pairs:
        last = runs[-1] if runs else None
        if last and local == last.local_start + last.count and remote == last.remote_start + last.count:
            runs[-1] = dataclasses.replace(last, count=last.count + 1)
        else:
            runs.append(Run(group, local, remote))
    return runs


def plan_transfer(
    groups: Sequence[GroupSpec],
    remote_ids: Sequence[Sequence[int]],
    local_ids: Sequence[Sequence[int]],
    num_tokens: int,
    local_hit_tokens: int,
    checkpoints: Sequence[Checkpoint] = (),
) -> TransferPlan:
    """What D must read from P so that it holds `num_tokens` prompt tokens, given its own hit."""
    if not len(groups) == len(remote_ids) == len(local_ids):
        raise PlanError(f"{len(groups)} groups but {len(remote_ids)} remote and {len(local_ids)} local lists")
    if not 0 <= local_hit_tokens <= num_tokens:
        raise PlanError(f"local hit {local_hit_tokens} outside 0..{num_tokens}")
    runs: list[Run] = []
    skipped = dropped = 0
    kept: list[Checkpoint] = []
    for g, (spec, remote, local) in enumerate(zip(groups, remote_ids, local_ids)):
        bs = spec.block_size
        needed = cdiv(num_tokens, bs)
        if local_hit_tokens % bs:
            raise PlanError(f"group {g}: local hit {local_hit_tokens} is not a multiple of block size {bs}")
        if len(remote) < needed or len(local) < needed:
            raise PlanError(
                f"group {g} ({spec.kind}): {num_tokens} tokens need {needed} blocks, P lists "
                f"{len(remote)} and D lists {len(local)}"
            )
        first = local_hit_tokens // bs
        if spec.kind == "attention":
            skipped += first
            pairs = list(zip(local[first:needed], remote[first:needed]))
        else:
            dropped += sum(1 for b in remote[: needed - 1] if b == NULL_BLOCK)
            pairs = []
            for cp in checkpoints:
                if cp.group == g and local_hit_tokens < cp.tokens <= num_tokens and cp.tokens % bs == 0:
                    pairs.append((cp.local_block, cp.remote_block))
                    kept.append(cp)
            if num_tokens > local_hit_tokens:
                pairs.append((local[needed - 1], remote[needed - 1]))
        for local_id, remote_id in pairs:
            if local_id == NULL_BLOCK or remote_id == NULL_BLOCK:
                raise PlanError(
                    f"group {g} ({spec.kind}): a needed block is a placeholder (local {local_id}, remote {remote_id})"
                )
        runs += coalesce(g, pairs)
    return TransferPlan(tuple(runs), num_tokens, tuple(kept), skipped, dropped)
