"""wheelhouse_pins.py (beside build_wheelhouse.sh) on a made-up resolution: what the GPU wheelhouse carries of
the image's packages (a version the image has that a pin rejects, one it accepts, one unknown), what it leaves
out with everything below it, and a requirement for Python 3.12 that a resolution by another Python missed.
check_site.py walks the same requirements through installed metadata (scratch folders of .dist-info folders)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

GPU = Path(__file__).resolve().parents[2] / "deploy" / "gpu"
IMAGE = """# the image's
torch==2.11.0+cu130 nvidia-nccl-cu13==2.28.9 nvidia-cublas==13.1.0.3
transformers==5.17.0 numba
# left out on purpose
tilelang
"""
# name -> (version, requires_dist)
RESOLVED = {
    "vllm": ("0.33.0", ["torch==2.14.0", "transformers<5.21,>=5.16.1", "numba==0.65.0", "tilelang==0.1.12",
                        "fastapi[standard]>=0.133", "six>=1.16; python_version > '3.11'",
                        "zentorch==2.14.0.1; extra == 'zen'"]),
    "torch": ("2.14.0", ["nvidia-nccl-cu13==2.30.7", "nvidia-cublas==13.1.1.3", "sympy>=1.13.3"]),
    "nvidia-nccl-cu13": ("2.30.7", []),
    "nvidia-cublas": ("13.1.1.3", []),
    "sympy": ("1.14.0", []),
    "transformers": ("5.20.2", []),
    "numba": ("0.65.0", ["llvmlite<0.48,>=0.47"]),
    "llvmlite": ("0.47.0", []),
    "tilelang": ("0.1.12", ["z3-solver"]),
    "z3-solver": ("4.15.4.0", []),
    "fastapi": ("0.136.3", ["starlette>=1.0", "uvicorn[standard]>=0.12; extra == 'standard'"]),
    "starlette": ("1.10.0", []),
    "uvicorn": ("0.54.0", ["httptools>=0.6.3; extra == 'standard'"]),
    "httptools": ("0.9.0", []),
    "zentorch": ("2.14.0.1", []),
    "six": ("1.17.0", []),
}


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, GPU / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def image(tmp_path: Path) -> str:
    (tmp_path / "image.txt").write_text(IMAGE)
    return str(tmp_path / "image.txt")


def report(without: tuple[str, ...] = ()) -> dict:
    return {"install": [{"metadata": {"name": n, "version": v, "requires_dist": r}}
                        for n, (v, r) in RESOLVED.items() if n not in without]}  # fmt: skip


def test_carries_what_the_image_lacks_or_has_at_a_rejected_version(image):
    pins, notes = load("wheelhouse_pins").carried(report(), image, set(), set(), ["vllm==0.33.0"])
    assert pins == ["fastapi==0.136.3", "httptools==0.9.0", "nvidia-cublas==13.1.1.3", "nvidia-nccl-cu13==2.30.7",
                    "six==1.17.0", "starlette==1.10.0", "sympy==1.14.0", "torch==2.14.0", "uvicorn==0.54.0",
                    "vllm==0.33.0"]  # fmt: skip
    # transformers 5.17.0 meets the pin; numba's version is unknown, so neither it nor llvmlite goes; tilelang is
    # left out with its z3-solver; zentorch is an extra nobody asked for
    assert "torch wants nvidia-nccl-cu13==2.30.7: carried, the image's 2.28.9 does not meet it" in notes
    assert "vllm wants numba==0.65.0: the image's version unknown" in notes
    assert not any("NOT RESOLVED" in n for n in notes)


def test_accept_takes_the_image_version_and_carry_the_resolved_one(image):
    mod = load("wheelhouse_pins")
    pins, notes = mod.carried(report(), image, {"nvidia-cublas"}, {"numba"}, ["vllm==0.33.0"])
    assert "nvidia-cublas==13.1.1.3" not in pins and "nvidia-nccl-cu13==2.30.7" in pins
    assert "torch wants nvidia-cublas==13.1.1.3: accepted: the image's 13.1.0.3" in notes
    assert {"numba==0.65.0", "llvmlite==0.47.0"} <= set(pins)


def test_a_requirement_the_resolution_missed_fails_the_build(image, tmp_path: Path):
    (tmp_path / "report.json").write_text(json.dumps(report(without=("six",))))
    mod = load("wheelhouse_pins")
    _, notes = mod.carried(report(without=("six",)), image, set(), set(), ["vllm==0.33.0"])
    assert "vllm wants six>=1.16; python_version > \"3.11\": NOT RESOLVED" in notes
    out = subprocess.run([sys.executable, str(GPU / "wheelhouse_pins.py"), str(tmp_path / "report.json"), image,
                          "--", "vllm==0.33.0"], capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 1 and "NOT RESOLVED" in out.stderr and "vllm==0.33.0" in out.stdout


def dist_info(site: Path, name: str, version: str, requires: list[str]) -> None:
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (folder / "METADATA").write_text("\n".join(lines) + "\n")


def test_check_site_lists_other_versions_and_fails_on_a_missing_one(image, tmp_path: Path):
    site, older = tmp_path / "site", tmp_path / "image-site"
    dist_info(site, "vllm", "0.33.0", ["torch==2.14.0", "tilelang==0.1.12", "numba==0.65.0", "six>=1.16"])
    dist_info(site, "torch", "2.14.0", ["nvidia-cublas==13.1.1.3"])
    dist_info(older, "torch", "2.11.0", [])  # shadowed by the site folder's
    dist_info(older, "nvidia-cublas", "13.1.0.3", [])
    dist_info(older, "numba", "0.68.1", [])
    run = [sys.executable, str(GPU / "check_site.py"), image, "vllm"]
    env = {"PYTHONPATH": f"{site}:{older}", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(run, capture_output=True, text=True, env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "MISSING: vllm wants six>=1.16: not found" in out.stdout
    assert f"other version: torch wants nvidia-cublas==13.1.1.3: 13.1.0.3 in {older}" in out.stdout
    assert "other version: vllm wants numba==0.65.0: 0.68.1" in out.stdout
    assert "tilelang" not in out.stdout and "torch==2.14.0" not in out.stdout  # left out; met by the site's
    dist_info(older, "six", "1.17.0", [])
    assert subprocess.run(run, capture_output=True, text=True, env=env).returncode == 0
