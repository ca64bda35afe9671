"""Slots: the bit each worker's block set has in the block maps (block_map.py), handed out, killed and reused.

A worker that loses its blocks (AllBlocksCleared, an engine restart, removal from the pool) does not have them
removed one by one: its slot is killed, which costs nothing, since a decision only ever asks about live slots, and
the worker gets a fresh one. The dead bits are swept out of the maps later, a few thousand keys per KV-event batch
(`step`), so no event and no request ever waits for a pass over the whole index; a sweep starts once dead entries
outnumber live ones, so each entry is swept at most once per death (amortized O(1) per event). Dead slots are
reused only after their sweep.

    new() -> slot --stores/removals--> kill(slot) --dead--> sweep (in steps) --free--> new() -> slot
"""

from __future__ import annotations

from .block_map import BlockMap, holders


class Slots:
    def __init__(
        self, maps: dict[int, BlockMap], sweep_min_entries: int = 1 << 16, sweep_step_keys: int = 1 << 12
    ) -> None:
        self.maps = maps  # the index's block maps, group -> BlockMap (the same dict, filled as groups appear)
        self.entries: list[int] = []  # per slot: the (block, group) entries it holds (dead ones: until swept)
        self.sweep_min_entries = sweep_min_entries  # dead entries below this are never worth a sweep
        self.sweep_step_keys = sweep_step_keys  # keys swept per step, at least
        self._free: list[int] = []  # swept slots, popped lowest first
        self._dead = 0  # bit set: killed, waiting for a sweep
        self._dead_entries = 0
        self._sweeping = 0  # bit set: killed, being swept
        self._todo: list[tuple[BlockMap, list[int]]] = []  # the sweep's snapshot of keys per map, used up from the end

    def new(self) -> int:
        if self._free:
            return self._free.pop()
        self.entries.append(0)
        return len(self.entries) - 1

    def kill(self, slot: int) -> None:
        """The slot's blocks are gone: its bit is ignored from now on and swept out later."""
        if not self.entries[slot]:  # no bit of it anywhere (the counts are exact): free at once
            self._free.append(slot)
            self._free.sort(reverse=True)
            return
        self._dead |= 1 << slot
        self._dead_entries += self.entries[slot]
        self._maybe_start()

    def live_entries(self) -> int:
        """Entries of slots not killed (live and retired workers)."""
        killed = self._dead | self._sweeping
        return sum(n for s, n in enumerate(self.entries) if not killed >> s & 1)

    def _maybe_start(self) -> None:
        if not self._sweeping and self._dead_entries > max(self.live_entries(), self.sweep_min_entries):
            self._start()

    def _start(self) -> None:
        self._sweeping, self._dead, self._dead_entries = self._dead, 0, 0
        self._todo = [(blocks, list(blocks.blocks)) for blocks in self.maps.values()]  # 8 bytes a key

    def step(self, budget: int = 0) -> None:
        """Sweep max(budget, sweep_step_keys) more keys; frees the swept slots when the sweep is done."""
        if not self._sweeping:
            return
        keep, left = ~self._sweeping, max(budget, self.sweep_step_keys)
        while self._todo and left > 0:
            blocks, keys = self._todo[-1]
            data, n = blocks.blocks, min(left, len(keys))
            for _ in range(n):
                k = keys.pop()
                v = data.get(k)
                if v is None:
                    continue
                bits = holders(v)
                if bits & self._sweeping:
                    kept = bits & keep
                    if not kept:
                        del data[k]
                    elif kept & (kept - 1) == 0:
                        data[k] = kept.bit_length() - 1
                    else:
                        data[k] = ~kept
            left -= n
            if not keys:
                self._todo.pop()
        if not self._todo:
            for s in range(len(self.entries)):
                if self._sweeping >> s & 1:
                    self.entries[s] = 0
                    self._free.append(s)
            self._free.sort(reverse=True)
            self._sweeping = 0
            self._maybe_start()

    def sweep(self) -> None:
        """Every dead slot swept out now, in one go (tests; a caller that can afford the pause)."""
        while self._sweeping or self._dead:
            if not self._sweeping:
                self._start()
            self.step(1 << 62)
