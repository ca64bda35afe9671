"""Who may import whom: the product (prefill/, decode/, proxy/, connector/) imports neither tests/ nor
benchmarks/; deploy/ runs no code of tests/ but the tests themselves (`bench_gpu.sh families` runs pytest);
and the harness the GPU machine runs (benchmarks/gpu/ and what it imports of benchmarks/) reaches nothing of
tests/. Read with `ast` from the sources: nothing is imported here."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("prefill", "decode", "proxy", "connector")
# the harness: what deploy/gpu/bench_gpu.sh and `deploy/dev.sh bench` start, and what tests import of it
HARNESS = ("benchmarks/gpu", "benchmarks/setups.py", "benchmarks/procs.py", "benchmarks/client.py",
           "benchmarks/workloads.py", "benchmarks/naming.py", "benchmarks/run.py", "benchmarks/report.py")
RUNS_TESTS_CODE = re.compile(r"python3?\s+(-m\s+tests\.|tests/\S+\.py)|PYTHONPATH=\S*tests")


def imports(path: Path) -> set[str]:
    """Every module a file imports (absolute names; relative ones resolved against benchmarks/)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = ".".join(path.relative_to(ROOT).parent.parts[: len(path.relative_to(ROOT).parent.parts)
                                                                       - node.level + 1])
                base = f"{package}.{base}" if base else package
            found |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
    return found


def top(names: set[str], *roots: str) -> set[str]:
    return {n for n in names if n.split(".")[0] in roots}


def module_file(name: str) -> Path | None:
    for candidate in (ROOT / (name.replace(".", "/") + ".py"), ROOT / name.replace(".", "/") / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def reach(start: list[Path]) -> dict[Path, set[str]]:
    """The files of benchmarks/ reachable from `start` by imports, each with what it imports."""
    seen: dict[Path, set[str]] = {}
    todo = list(start)
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen[path] = imports(path)
        todo += [f for f in map(module_file, top(seen[path], "benchmarks")) if f is not None]
    return seen


def test_the_product_imports_neither_tests_nor_benchmarks():
    bad = {str(p.relative_to(ROOT)): sorted(top(imports(p), "tests", "benchmarks"))
           for folder in PRODUCT for p in sorted((ROOT / folder).rglob("*.py"))}
    assert not {k: v for k, v in bad.items() if v}


def test_the_wheel_ships_neither_tests_nor_benchmarks():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = set(setup["package-dir"].values())
    assert set(setup["packages"]) == set(setup["package-dir"])  # nothing found by discovery
    assert not {f for f in folders if f.split("/")[0] in ("tests", "benchmarks")}


def test_deploy_reaches_nothing_of_tests():
    py = {str(p.relative_to(ROOT)): sorted(top(imports(p), "tests")) for p in sorted((ROOT / "deploy").rglob("*.py"))}
    assert not {k: v for k, v in py.items() if v}
    scripts = [f"{p.relative_to(ROOT)}: {m.group()}" for p in sorted((ROOT / "deploy").rglob("*.sh"))
               for m in RUNS_TESTS_CODE.finditer(p.read_text())]
    assert not scripts, scripts


def test_the_harness_reaches_nothing_of_tests():
    start = [p for entry in HARNESS for p in ([ROOT / entry] if entry.endswith(".py")
                                               else sorted((ROOT / entry).glob("*.py")))]
    reached = reach(start)
    assert ROOT / "benchmarks" / "setups.py" in reached and ROOT / "benchmarks" / "procs.py" in reached
    bad = {str(p.relative_to(ROOT)): sorted(top(names, "tests")) for p, names in reached.items()}
    assert not {k: v for k, v in bad.items() if v}


def test_the_reader_sees_imports(tmp_path):
    assert top({"tests.support.procs", "benchmarks.setups", "hybrid_pd.proxy"}, "tests") == {"tests.support.procs"}
    assert "benchmarks.fleetsim_engine" in imports(ROOT / "benchmarks" / "fleetsim_core.py")  # `from .fleetsim_engine`
    assert "hybrid_pd.prefill.dev.demo_workload" in imports(ROOT / "benchmarks" / "client.py")
    assert RUNS_TESTS_CODE.search("PYTHONPATH=$ROOT python3 -m tests.support.storm")
    assert not RUNS_TESTS_CODE.search("python3 -m pytest tests/connector/test_families.py -q")
