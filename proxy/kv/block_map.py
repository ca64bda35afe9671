"""Block key -> the workers holding that block, for one KV-cache group: the shape of a fleet's routing index.

Workers are numbered by slot (index.py hands them out); a set of slots is a Python int with bit s set for slot s.
A map value is stored in whichever form costs least:

    value >= 0    one holder, slot `value` (ints up to 256 are CPython's shared small ints: no object per entry)
    value <  0    several holders, the bit set ~value

so a block only one worker holds costs one dict entry and its key, and a block the whole fleet holds one entry,
its key and one int of fleet-size bits, whatever the fleet's size. Reading a value is `holders()`.

Slots are never cleared one entry at a time: a worker that loses its whole cache gets a fresh slot and its old
one is dead; dead bits stay in the map, unseen (a decision only ever asks about live slots), until slots.py sweeps
them out.
"""

from __future__ import annotations

from collections.abc import Iterable


def holders(value: int | None) -> int:
    """The bit set of slots a map value stands for (0 for a block nobody holds)."""
    if value is None:
        return 0
    return 1 << value if value >= 0 else ~value


class BlockMap:
    """One group's blocks: key -> holders (encoded as above)."""

    __slots__ = ("blocks",)

    def __init__(self) -> None:
        self.blocks: dict[int, int] = {}

    def store(self, slot: int, keys: Iterable[int]) -> int:
        """Slot `slot` now holds `keys`; returns how many it did not hold before."""
        blocks, setdefault, bit, before, added = self.blocks, self.blocks.setdefault, 1 << slot, len(self.blocks), 0
        for k in keys:
            v = setdefault(k, slot)  # a new block: held by this slot alone, counted by the map's growth
            if v == slot:
                continue
            if v >= 0:
                blocks[k] = ~((1 << v) | bit)
            elif ~v & bit:
                continue
            else:
                blocks[k] = v & ~bit  # ~(~v | bit)
            added += 1
        return added + len(blocks) - before

    def remove(self, slot: int, keys: Iterable[int]) -> int:
        """Slot `slot` no longer holds `keys`; returns how many it held."""
        blocks, get, bit, removed = self.blocks, self.blocks.get, 1 << slot, 0
        for k in keys:
            v = get(k)
            if v is None:
                continue
            if v >= 0:
                if v != slot:
                    continue
                del blocks[k]
            else:
                bits = ~v
                if not bits & bit:
                    continue
                bits ^= bit
                blocks[k] = bits.bit_length() - 1 if bits & (bits - 1) == 0 else ~bits
            removed += 1
        return removed

    def held_by(self, slot: int) -> set[int]:
        """The keys `slot` holds (a scan: for tests and debugging, never on the request path)."""
        bit = 1 << slot
        return {k for k, v in self.blocks.items() if holders(v) & bit}
