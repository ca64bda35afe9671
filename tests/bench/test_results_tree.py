"""One benchmark tree with one naming rule: every results folder is benchmarks/results/<date>-<machine>-<topic>/
with a summary.md and no large raw file left uncompressed, and every path under benchmarks/ that the
repository names (docs, code comments, scripts, summaries) exists."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from benchmarks.naming import NAME, RESULTS, problems, results_dir

ROOT = Path(__file__).resolve().parents[2]
# a path under benchmarks/ as prose and code name it (a trailing `*` is a glob, `<date>` a placeholder)
MENTION = re.compile(r"benchmarks/[A-Za-z0-9_.*/-]*[A-Za-z0-9_*/]")
# where results and the harness lived before this tree (tests/bench/ holds the harness's tests only)
OLD = re.compile(r"tests/bench/(?!test_)|tests\.bench\.|deploy/gpu/results|deploy/gpu/[a-z_]+\.py"
                 r"|bench_setups|bench_client|bench_gpu\.py")


def tracked_text() -> dict[Path, str]:
    """The repository's tracked prose and code (raw data under results/ is kept as it was recorded)."""
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for name in names:
        path = ROOT / name
        raw_data = name.startswith("benchmarks/results/") and path.suffix != ".md"
        if path.suffix in (".md", ".py", ".sh", ".yaml", ".toml") and not raw_data and path.is_file():
            out[path] = path.read_text(errors="replace")
    return out


def test_every_results_folder_follows_the_rule():
    folders = sorted(p for p in RESULTS.iterdir() if p.is_dir())
    assert len(folders) > 20
    found = [problem for folder in folders for problem in problems(folder)]
    assert not found, "\n".join(found)


def test_the_rule_sees_what_breaks_it(tmp_path):
    bad = tmp_path / "h100-qwen3next"
    bad.mkdir()
    (bad / "part-x.json").write_bytes(b"0" * (300 * 1024))
    assert problems(bad) == ["h100-qwen3next: not <date>-<machine>-<topic>", "h100-qwen3next: no summary.md",
                             "h100-qwen3next/part-x.json: 307200 bytes uncompressed (gzip it)"]
    for name in ("2026-11-24-h100-qwen3next-r2", "2026-11-24-h200x2-nemotronh", "2026-11-25-cpu-kv-index"):
        assert NAME.fullmatch(name), name
    assert results_dir("h100", "boundary", "2026-11-25") == RESULTS / "2026-11-25-h100-boundary"
    with pytest.raises(ValueError):
        results_dir("H100 x2", "boundary")


def test_named_benchmark_paths_exist():
    missing = []
    for path, text in tracked_text().items():
        for mention in MENTION.findall(text):
            if "<" in mention or mention.endswith("/results/"):
                continue
            if not any(ROOT.glob(mention.rstrip("/"))):
                missing.append(f"{path.relative_to(ROOT)}: {mention}")
    assert not missing, "paths that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_old_trees_are_named_nowhere():
    stale = [f"{path.relative_to(ROOT)}: {m.group()}" for path, text in tracked_text().items()
             for m in OLD.finditer(text) if path != Path(__file__)]
    assert not stale, "\n".join(stale)
