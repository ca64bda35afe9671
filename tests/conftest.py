"""Shared fixtures: the tiny models and a module-scoped launcher that stops every process by PID."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.procs import Launched


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


def pytest_terminal_summary(terminalreporter):
    """The largest |top-1 log-probability delta| of each output comparison against one engine this session, and
    how far each negative control moved the answer."""
    from tests.support.controls import MOVES
    from tests.support.conversation import LOGPROB_TOL, PARITY

    if PARITY:
        terminalreporter.write_sep("-", f"log-probability parity (tolerance {LOGPROB_TOL} nats)")
        for label, delta in sorted(PARITY.items()):
            terminalreporter.write_line(f"{delta:9.5f}  {label}")
    if MOVES:
        terminalreporter.write_sep("-", "decoder-alone turn from spoiled bytes: max |top-1 delta|, reference token "
                                        "lost (max, positions > 1 nat)")
        for (family, label), m in sorted(MOVES.items()):
            terminalreporter.write_line(f"{m.top1_delta:9.4f} {max(m.reference_token):9.4f} "
                                        f"{m.over_one_nat}/{len(m.reference_token)}  {family}: {label}")
