#!/usr/bin/env bash
# hybrid-pd developer entry point. Creates or refreshes the project's virtual environment, then runs:
#   bash deploy/dev.sh demo    run the whole system on its embedded default (tiny model, 1 P + 1 D + proxy)
#   bash deploy/dev.sh test    run the test suite (what CI runs): the fast lane, then the engine lane
#   bash deploy/dev.sh bench   run the benchmark harness (benchmarks/run.py; writes benchmarks/results/<date>-cpu-workloads/)
#   bash deploy/dev.sh env     only set up the environment and print the venv's path
#   bash deploy/dev.sh run ARGS...   run any command inside the environment
# Two environments: the heavy dependencies (vLLM, torch, NIXL; several GB) live in one shared venv outside the
# clone (HYBRID_PD_DEPS_VENV, default ~/.cache/hybrid-pd/deps-STAMP, one per dependency set: a clone whose
# pyproject.toml asks for other dependencies builds its own; it never holds hybrid-pd itself), and each clone gets its own thin venv, $ROOT/.venv (HYBRID_PD_VENV),
# holding only this clone's editable install plus one path line (.pth, no code) that puts the shared
# dependencies on sys.path. So clones share the heavy part but a test run can only import its own clone's code.
# A third venv holds the manifest scanner the deploy tests run (checkov; HYBRID_PD_SCAN_VENV), apart from both.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HYBRID_PD_VENV:-$ROOT/.venv}
PY=${HYBRID_PD_PYTHON:-$(command -v python3.11 || command -v python3)}
EXTRAS=${HYBRID_PD_EXTRAS:-cpu,test,bench}
SCAN=${HYBRID_PD_SCAN_VENV:-$HOME/.cache/hybrid-pd/scan-venv}  # the manifest scanner's own venv (test extra)

log() { echo "[hybrid-pd] $*" >&2; }

deps_stamp() {  # what the dependency install depends on: the dependency lists, the extras, this script
  { sed -n '/^dependencies/,/^\[tool.setuptools\]/p' "$ROOT/pyproject.toml"; echo "$EXTRAS"; \
    sed -n '/^install_deps()/,/^}/p' "$0"; } | sha256sum | cut -c1-16
}

# One shared dependency venv per dependency set (the stamp names it): clones whose pyproject.toml asks for other
# dependencies get their own instead of reinstalling one venv back and forth under each other's running tests.
DEPS=${HYBRID_PD_DEPS_VENV:-$HOME/.cache/hybrid-pd/deps-$(deps_stamp)}

install_deps() {
  log "installing dependencies into $DEPS (extras: $EXTRAS); first time takes a few minutes"
  "$DEPS/bin/pip" install -q --upgrade "pip>=24" "setuptools>=68" wheel
  "$DEPS/bin/pip" install -q "$ROOT[$EXTRAS]"
  # The project itself belongs to each clone's own venv, never to the shared one.
  "$DEPS/bin/pip" uninstall -y -q hybrid-pd
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds: beside torch+cpu they fail to import and
  # break transformers' model imports ("operator torchvision::nms does not exist"). Text models need none.
  "$DEPS/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
}

setup_scan() {  # checkov, pinned in deploy/k8s/scan-requirements.txt; apart: its pins would move vLLM's
  local req="$ROOT/deploy/k8s/scan-requirements.txt" stamp
  stamp=$(sha256sum "$req" | cut -c1-16)
  [ "$(cat "$SCAN/.hybrid-pd-scan" 2>/dev/null)" = "$stamp" ] && return 0
  log "installing the manifest scanner into $SCAN (its own venv)"
  [ -x "$SCAN/bin/python" ] || "$PY" -m venv "$SCAN"
  if "$SCAN/bin/pip" install -q -r "$req"; then echo "$stamp" > "$SCAN/.hybrid-pd-scan"
  else log "could not install the manifest scanner: tests/deploy/test_security_scan.py will fail"; fi
}

site_of() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

setup_env() {
  [ -x "$DEPS/bin/python" ] || { log "creating $DEPS"; "$PY" -m venv "$DEPS"; }
  local stamp; stamp=$(deps_stamp)
  if [ "$(cat "$DEPS/.hybrid-pd-deps" 2>/dev/null)" != "$stamp" ]; then
    install_deps
    echo "$stamp" > "$DEPS/.hybrid-pd-deps"
  fi
  [ -x "$VENV/bin/python" ] || { log "creating $VENV (this clone's own)"; "$PY" -m venv --without-pip "$VENV"; }
  if [ ! -x "$VENV/bin/pytest" ]; then  # the shared venv's pytest runs its own python, which cannot see this clone
    printf '#!/bin/sh\nexec "%s/bin/python" -m pytest "$@"\n' "$VENV" > "$VENV/bin/pytest"
    chmod +x "$VENV/bin/pytest"
  fi
  local deps_site; deps_site=$(site_of "$DEPS")
  echo "$deps_site" > "$(site_of "$VENV")/hybrid_pd_deps.pth"  # a path, not code: the shared dependencies
  # This clone, editable (cheap; redone when the package list or entry points change).
  local pkg; pkg=$(sed -n '/^\[project.scripts\]/,/^\[tool.mypy\]/p' "$ROOT/pyproject.toml" | sha256sum | cut -c1-16)
  if [ "$(cat "$VENV/.hybrid-pd-pkg" 2>/dev/null)" != "$pkg" ]; then
    "$DEPS/bin/python" -m pip --python "$VENV/bin/python" install -q --no-deps --no-build-isolation -e "$ROOT"
    echo "$pkg" > "$VENV/.hybrid-pd-pkg"
  fi
}

cmd=${1:-demo}; shift || true
setup_env
case ",$EXTRAS," in *,test,*) setup_scan; export HYBRID_PD_CHECKOV="$SCAN/bin/checkov" ;; esac
export PATH="$VENV/bin:$DEPS/bin:$PATH"
# mypy's cache beside the shared dependencies, per dependency set: a clean clone checks in seconds, not a minute
# (it re-reads vLLM and torch otherwise). mypy validates each entry against the source it read, and replaces cache
# files atomically, so clones can share it.
export MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-$DEPS/.mypy_cache}
cd "$ROOT"
case "$cmd" in
  env)  echo "$VENV" ;;
  demo) exec "$VENV/bin/hybrid-pd" demo "$@" ;;
  test)  # two lanes: the fast one (no vLLM engine) fails first; then the tests that start engines. Each says its
         # wall time. Coverage only when asked (--cov=hybrid_pd): the engine lane's then appends to the fast lane's.
    lane() { local name=$1 t0=$SECONDS; shift; log "test lane: $name"
             "$VENV/bin/python" -m pytest tests "$@" || { log "lane $name failed after $((SECONDS - t0)) s"; return 1; }
             log "lane $name passed in $((SECONDS - t0)) s"; }
    # The engine lane's tiny models (cached; the families: HYBRID_PD_TEST_FAMILIES, tests/connector/test_families.py)
    # are built before it, outside the tests' time limit (900 s a test, the fixture that builds one included).
    models() { local t0=$SECONDS f; log "tiny models of the engine lane"
               for f in qwen3_next $(tr , ' ' <<< "${HYBRID_PD_TEST_FAMILIES:-lfm2,qwen3_5}"); do
                 "$VENV/bin/python" -m hybrid_pd.prefill.dev.tiny_model --family "$f" >&2 || return 1
               done
               "$VENV/bin/python" -m hybrid_pd.prefill.dev.tiny_model --seed 1 >&2 || return 1  # conftest.py's 2nd
               log "tiny models ready in $((SECONDS - t0)) s"; }
    append=(); case " $* " in *" --cov"*) append=(--cov-append) ;; esac
    t0=$SECONDS rc=0
    lane fast -m "not engines" "$@" && models && lane engines -m engines "${append[@]}" "$@" || rc=$?
    log "tests: $((SECONDS - t0)) s"; exit "$rc" ;;
  bench) exec "$VENV/bin/python" -m benchmarks.run "$@" ;;
  run)  exec "$@" ;;
  *)    echo "usage: bash deploy/dev.sh {demo|test|bench|env|run CMD...}" >&2; exit 2 ;;
esac
