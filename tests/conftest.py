"""Shared fixtures: the tiny models, the session's pool of engines (tests/support/engines.py) and a module-scoped
launcher that stops every process by PID; the engine lane's order."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.engines import EnginePool, Engines
from tests.support.procs import Launched

POOL = pytest.StashKey[EnginePool]()
# The order of the modules that share engines (tests/support/engines.py), chosen so that the pool seldom stops an
# engine a later module asks for: the module whose three upstream engines crowd the pool first, then the plain
# engine's, then those of our prefiller and decoder, then the other tiny families. Modules not named here run after.
SHARING_ORDER = (
    "tests/e2e/test_upstream_pd.py",
    "tests/proxy/test_bad_input_engine.py",
    "tests/proxy/test_real_engine.py",
    "tests/connector/test_local_hits.py",
    "tests/connector/test_digest_engines.py",
    "tests/connector/test_engines.py",
    "tests/connector/test_prefiller_hits.py",
    "tests/proxy/test_handshakes_engine.py",
    "tests/proxy/test_placement_engines.py",
    "tests/proxy/test_early_decode_engines.py",
    "tests/proxy/test_tokenizer_engine.py",
    "tests/connector/test_families.py",
)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model

    return str(build_tiny_model(TinyModelSpec(seed=0)))


@pytest.fixture(scope="session")
def tiny_model_other_weights() -> str:
    from hybrid_pd.prefill.dev.tiny_model import TinyModelSpec, build_tiny_model

    return str(build_tiny_model(TinyModelSpec(seed=1)))


@pytest.fixture(scope="session")
def logs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def engine_pool(request, logs_dir):
    pool = request.config.stash[POOL] = EnginePool(logs_dir)
    yield pool
    pool.stop_all()


@pytest.fixture(scope="module")
def engine_set(request, engine_pool):
    """`engine_set(specs, vllm_args=())`: this module's named engines (`Engines`), from the session's pool."""
    return lambda specs, vllm_args=(): Engines(engine_pool, request.node.nodeid, specs, vllm_args)


def shares_engines(item) -> bool:
    return "engine_set" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items):
    """The modules that share engines first, in SHARING_ORDER, then those that start their own: the pool stops its
    engines after its last user. Each module's tests stay together and in their order."""
    def rank(item) -> tuple[int, int]:
        if not shares_engines(item):
            return 2, 0
        path = item.nodeid.split("::")[0]
        return (0, SHARING_ORDER.index(path)) if path in SHARING_ORDER else (1, 0)

    items.sort(key=rank)  # stable


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield
    pool = item.config.stash.get(POOL, None)
    if pool and shares_engines(item) and not (nextitem and shares_engines(nextitem)):
        pool.stop_all()  # the rest of the session starts its own engines: the memory is theirs


@pytest.fixture(scope="module")
def launch(logs_dir):
    """Start processes; every one is stopped by PID when the module's tests are done."""
    started: list[Launched] = []

    def start(name: str, argv: list[str], url: str, env: dict | None = None) -> Launched:
        proc = Launched(name, argv, url, logs_dir, env)
        started.append(proc)
        return proc

    yield start
    for proc in reversed(started):
        proc.stop()


def pytest_terminal_summary(terminalreporter, config):
    """Every engine the pool started (module, seconds to healthy); the largest |top-1 log-probability delta| of each
    output comparison against one engine this session, and how far each negative control moved the answer."""
    from tests.support.controls import MOVES
    from tests.support.conversation import PARITY, tolerance

    pool = config.stash.get(POOL, None)
    if pool and pool.starts:
        terminalreporter.write_sep("-", f"engines started by the pool: {len(pool.starts)}, "
                                        f"{sum(s for _, _, s in pool.starts):.0f} s to healthy")
        for owner, name, seconds in pool.starts:
            terminalreporter.write_line(f"{seconds:6.1f} s  {owner}: {name}")

    if PARITY:
        terminalreporter.write_sep("-", f"log-probability parity (tolerance {tolerance():.4f} nats)")
        for label, delta in sorted(PARITY.items()):
            terminalreporter.write_line(f"{delta:9.5f}  {label}")
    if MOVES:
        terminalreporter.write_sep("-", "decoder-alone turn from spoiled bytes: max |top-1 delta|, reference token "
                                        "lost (max, positions > 1 nat)")
        for (family, label), m in sorted(MOVES.items()):
            terminalreporter.write_line(f"{m.top1_delta:9.4f} {max(m.reference_token):9.4f} "
                                        f"{m.over_one_nat}/{len(m.reference_token)}  {family}: {label}")
