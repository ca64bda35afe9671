"""A vLLM release's Python source, for tests that read it (never import or run it): the `vllm` wheel is
downloaded once with pip (no dependencies) and only the files a test asks for are kept, with the wheel's
file list, under ~/.cache/hybrid-pd/vllm-src/<version>/ (HYBRID_PD_VLLM_SRC moves it)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("HYBRID_PD_VLLM_SRC", Path.home() / ".cache/hybrid-pd/vllm-src"))


class VllmSource:
    def __init__(self, version: str, root: Path):
        self.version, self.root = version, root
        self.files = set((root / "wheel-files.txt").read_text().split())

    def parse(self, path: str) -> ast.Module | None:
        """The file's syntax tree; None when the release has no such file."""
        return ast.parse((self.root / path).read_text(), path) if path in self.files else None

    def module(self, dotted: str) -> tuple[str, ast.Module | None]:
        base = dotted.replace(".", "/")
        path = next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in self.files), f"{base}.py")
        return path, self.parse(path)


def vllm_source(version: str, paths: list[str]) -> VllmSource:
    """`paths` (wheel paths; ones the release lacks are fine) from the cache, downloading the wheel if one
    is not cached yet. Raises RuntimeError, saying what to do, when the download fails."""
    root = CACHE / version
    if (root / "wheel-files.txt").exists():
        src = VllmSource(version, root)
        if all((root / p).exists() for p in paths if p in src.files):
            return src
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE, prefix=f".{version}-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--only-binary=:all:",
               "--ignore-requires-python", "--progress-bar", "off", "-q", f"vllm=={version}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        wheels = list(Path(tmp).glob("vllm-*.whl"))
        if done.returncode or not wheels:
            raise RuntimeError(
                f"could not download the vllm=={version} wheel ({' '.join(cmd[2:])} exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[-800:]}). This test reads vLLM's source and needs PyPI "
                f"once per release; offline, unzip that release's wheel into {root} (`unzip vllm-{version}-*.whl "
                f"'vllm/*.py' -d {root}`) and list its .py files in {root}/wheel-files.txt (`unzip -Z1`).")
        new = Path(tmp) / "src"
        new.mkdir()
        with zipfile.ZipFile(wheels[0]) as whl:
            names = [n for n in whl.namelist() if n.endswith(".py")]
            for path in set(paths) & set(names):
                (new / path).parent.mkdir(parents=True, exist_ok=True)
                (new / path).write_bytes(whl.read(path))
        (new / "wheel-files.txt").write_text("\n".join(sorted(names)) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        new.rename(root)
    return VllmSource(version, root)
