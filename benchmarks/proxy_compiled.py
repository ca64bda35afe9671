"""The proxy compiled with mypyc, for measuring against the pure-Python one.

    python -m benchmarks.proxy_compiled build DIR [--modules GLOB...]
                                                      the code folders under DIR/hybrid_pd, the proxy's modules
                                                      (or those named) compiled in place (minutes of gcc); then
    python -m benchmarks.proxy_ab --baseline-dir DIR --router ...    the whole proxy, compiled against pure
    PYTHONPATH=DIR python -m benchmarks.proxy_compiled micro          its hot pure functions, in-process
    python -m benchmarks.proxy_compiled micro                         the same, pure (the editable install)

mypyc (it ships with mypy) turns type-annotated modules into C extensions; an extension module wins over the .py
beside it at import. What does not compile stays interpreted (NOT_COMPILED says why). micro times functions that
are ours alone (no I/O, no event loop) per call, so a compiled module's gain can be read apart from the whole
request, where uvloop, uvicorn, httptools and msgspec are C already.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE_FOLDERS = ("proxy", "connector", "prefill", "decode")
COMPILED = ("proxy/*.py", "proxy/http/*.py", "proxy/routing/*.py", "proxy/placement/*.py", "proxy/kv/*.py")
NOT_COMPILED = {
    # mypyc 2.4: compiling the subclass of uvicorn's HttpToolsProtocol stops with an internal error (its
    # attributes come from the interpreted base class)
    "proxy/http/server.py",
    # the settings are declared by reading the dataclasses' annotations at run time (config/declare.py): the
    # compiled classes answer None where a type is expected
    "proxy/config/*.py",
    # run as __main__ by `python -m`: the .py runs whatever sits beside it
    "proxy/server.py",
    # the error classes override their parent's annotated class attributes (status, type): compiled, those are
    # instance slots the subclasses never fill ("'BadRequest' object has no attribute 'status'": every error a 500)
    "proxy/errors.py",
    # ProxyMetrics.collect walks vars(self): a compiled instance has no __dict__ (every /metrics scrape a 500)
    "proxy/metrics.py",
    # msgspec reads a Struct's options (array_like, tag) from its class: compiled, vLLM's KV events stop decoding
    "proxy/kv/events.py",
}
MYPY_INI = """\
[mypy]
python_version = 3.11
explicit_package_bases = True
ignore_missing_imports = True

[mypy-transformers.*,torch.*,kubernetes.*,huggingface_hub.*,tokenizers.*,vllm.*,numpy.*]
# imported lazily and never compiled: following them costs minutes of type checking
follow_imports = skip
"""
SETUP = """\
from setuptools import setup
from mypyc.build import mypycify
setup(name="hybrid-pd-compiled", ext_modules=mypycify({modules!r} + ["--config-file", "mypy.ini"], opt_level="3"))
"""


def build(out: Path, compiled: tuple[str, ...] = COMPILED) -> None:
    if out.exists():
        shutil.rmtree(out)
    pkg = out / "hybrid_pd"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    for folder in CODE_FOLDERS:
        shutil.copytree(ROOT / folder, pkg / folder, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    skip = {p for pattern in NOT_COMPILED for p in pkg.glob(pattern)}
    modules = sorted(str(p.relative_to(out)) for pattern in compiled for p in pkg.glob(pattern) if p not in skip)
    (out / "mypy.ini").write_text(MYPY_INI)
    (out / "setup_compiled.py").write_text(SETUP.format(modules=modules))
    t0 = time.monotonic()
    subprocess.run([sys.executable, "setup_compiled.py", "build_ext", "--inplace", "-j", "2"], cwd=out, check=True,
                   stdout=subprocess.DEVNULL)
    print(f"{len(modules)} modules compiled in {time.monotonic() - t0:.0f} s; importable from {out}")


def per_call_us(fn, n: int = 20000, repeat: int = 7) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def micro() -> None:
    import msgspec

    from hybrid_pd.proxy import admission, openai_api, request_fields, usage
    from hybrid_pd.proxy.config.sections import AdmissionConfig
    from hybrid_pd.proxy.metrics import ProxyMetrics

    compiled = {m.__name__.rsplit(".", 1)[1]: m.__file__.endswith(".so") for m in (openai_api, usage, admission)}
    raw = msgspec.json.encode({"model": "fake-model", "prompt": "hello world " * 50, "max_tokens": 32})
    req = openai_api.parse_request("completions", raw)
    answer = {"choices": [{"text": "x" * 32}], "usage": {"prompt_tokens": 101, "completion_tokens": 32,
                                                         "total_tokens": 133}}
    gate = admission.Admission(AdmissionConfig(), ProxyMetrics())

    def enter_exit() -> None:
        gate.try_enter()
        gate.exit()

    cases = {
        "openai_api.parse_request (completions, 600-char prompt)": lambda: openai_api.parse_request("completions", raw),
        "request_fields.check_fields": lambda: request_fields.check_fields(req.body),
        "OpenAIRequest.prefill_body + decode_body": lambda: (req.prefill_body(False), req.decode_body({}, False)),
        "usage.fix_usage": lambda: usage.fix_usage(answer, 64, 0),
        "admission try_enter + exit": enter_exit,
    }
    print(f"compiled: {compiled}")
    for name, fn in cases.items():
        print(f"{name}: {per_call_us(fn):.3f} us per call")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                 epilog=textwrap.dedent(__doc__.split("\n\n", 1)[1]))
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("dir", type=Path)
    b.add_argument("--modules", nargs="+", default=COMPILED, help="globs of the modules to compile, from the root")
    sub.add_parser("micro")
    args = ap.parse_args(argv)
    if args.cmd == "build":
        build(args.dir.resolve(), tuple(args.modules))
    else:
        micro()
    return 0


if __name__ == "__main__":
    sys.exit(main())
