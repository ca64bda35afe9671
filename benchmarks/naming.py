"""The one naming rule of the results tree: every run is a folder results/<date>-<machine>-<topic>/ holding a
summary.md (command, machine, commit, the figures) and its raw data, anything over RAW_LIMIT bytes gzipped
(or left out, the summary saying where it stayed). A logbook gets a folder per day of entries.

    2026-11-24-h100-qwen3next-r2    one H100; the second run of the day on the Qwen3-Next shapes
    2026-11-24-h200x2-nemotronh     two H200s
    2026-11-25-cpu-kv-index         the 2-core CPU test bed
"""

from __future__ import annotations

import re
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
NAME = re.compile(r"(?P<date>\d{4}-\d{2}-\d{2})-(?P<machine>cpu|[a-z]+\d+(?:x\d+)?)-(?P<topic>[a-z0-9][a-z0-9.-]*)")
RAW_LIMIT = 200 * 1024
UNCOMPRESSED = (".json", ".jsonl", ".txt", ".log", ".md", ".csv", ".tar")


def results_dir(machine: str, topic: str, date: str | None = None) -> Path:
    """Where a run of today (or `date`) on `machine` about `topic` writes: RESULTS/<date>-<machine>-<topic>."""
    name = f"{date or time.strftime('%Y-%m-%d', time.gmtime())}-{machine}-{topic}"
    if not NAME.fullmatch(name):
        raise ValueError(f"{name!r} does not follow <date>-<machine>-<topic> (benchmarks/naming.py)")
    return RESULTS / name


def problems(folder: Path) -> list[str]:
    """What keeps a results folder from following the rule (empty: it does)."""
    found = []
    if not NAME.fullmatch(folder.name):
        found.append(f"{folder.name}: not <date>-<machine>-<topic>")
    if not (folder / "summary.md").is_file():
        found.append(f"{folder.name}: no summary.md")
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        if path.suffix in UNCOMPRESSED and path.stat().st_size > RAW_LIMIT:
            found.append(f"{path.relative_to(folder.parent)}: {path.stat().st_size} bytes uncompressed (gzip it)")
    return found
