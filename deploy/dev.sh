#!/usr/bin/env bash
# hybrid-pd developer entry point. Creates or refreshes the project's virtual environment, then runs:
#   bash deploy/dev.sh demo    run the whole system on its embedded default (tiny model, 1 P + 1 D + proxy)
#   bash deploy/dev.sh test    run the test suite (what CI runs)
#   bash deploy/dev.sh bench   run the benchmark harness (tests/bench/run.py; writes tests/bench/results/)
#   bash deploy/dev.sh env     only set up the environment and print the venv's path
#   bash deploy/dev.sh run ARGS...   run any command inside the environment
# The venv lives outside the clone (HYBRID_PD_VENV, default ~/.cache/hybrid-pd/venv) so that fresh clones
# reuse the heavy dependencies (vLLM, torch, NIXL); it is rebuilt when pyproject.toml's dependencies change.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HYBRID_PD_VENV:-$HOME/.cache/hybrid-pd/venv}
PY=${HYBRID_PD_PYTHON:-$(command -v python3.11 || command -v python3)}
EXTRAS=${HYBRID_PD_EXTRAS:-cpu,test,bench}

log() { echo "[hybrid-pd] $*" >&2; }

deps_stamp() {  # what the dependency install depends on: the dependency lists, the extras, this script
  { sed -n '/^dependencies/,/^\[tool.setuptools\]/p' "$ROOT/pyproject.toml"; echo "$EXTRAS"; \
    sed -n '/^install_deps()/,/^}/p' "$0"; } | sha256sum | cut -c1-16
}

install_deps() {
  log "installing dependencies into $VENV (extras: $EXTRAS); first time takes a few minutes"
  "$VENV/bin/pip" install -q --upgrade "pip>=24" "setuptools>=68" wheel
  "$VENV/bin/pip" install -q "$ROOT[$EXTRAS]"
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: beside torch+cpu they fail to import and
  # break transformers' model imports ("operator torchvision::nms does not exist"). Text models need none.
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
}

setup_env() {
  [ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
  local stamp; stamp=$(deps_stamp)
  if [ "$(cat "$VENV/.hybrid-pd-deps" 2>/dev/null)" != "$stamp" ]; then
    install_deps
    echo "$stamp" > "$VENV/.hybrid-pd-deps"
    rm -f "$VENV/.hybrid-pd-src"  # the install above put a plain copy of the project there: re-point it
  fi
  # The project itself: editable, from this clone (cheap; re-pointed whenever the clone moves).
  if [ "$(cat "$VENV/.hybrid-pd-src" 2>/dev/null)" != "$ROOT" ]; then
    "$VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$ROOT"
    echo "$ROOT" > "$VENV/.hybrid-pd-src"
  fi
  # NIXL progress-thread delay and CPU affinity hooks, shared with the worker images
  sh "$ROOT/deploy/docker/site_hooks.sh" "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
}

cmd=${1:-demo}; shift || true
setup_env
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
case "$cmd" in
  env)  echo "$VENV" ;;
  demo) exec "$VENV/bin/hybrid-pd" demo "$@" ;;
  test) exec "$VENV/bin/python" -m pytest tests "$@" ;;
  bench) exec "$VENV/bin/python" -m tests.bench.run "$@" ;;
  run)  exec "$@" ;;
  *)    echo "usage: bash deploy/dev.sh {demo|test|bench|env|run CMD...}" >&2; exit 2 ;;
esac
