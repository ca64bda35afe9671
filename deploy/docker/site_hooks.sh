#!/usr/bin/env sh
# Interpreter-start hooks for an environment that runs vLLM workers (deploy/dev.sh and the worker images):
#   sh deploy/docker/site_hooks.sh SITE_PACKAGES_DIR
# NIXL's Python API hard-codes a 0 us progress-thread delay (a spinning core per agent): the first hook lets
# every process (vLLM's engine cores included) honour NIXL_PTHR_DELAY_US. The second keeps a CPU worker's
# threads on its --cpu-bind cores, which vLLM's NixlConnector moves (prefill/affinity_guard.py).
set -eu
site=${1:?site-packages folder}
echo 'import os; os.environ.get("NIXL_PTHR_DELAY_US") and __import__("hybrid_pd.connector.nixl_delay", fromlist=["install"]).install()' \
  > "$site/hybrid_pd_nixl_delay.pth"
echo 'import os; os.environ.get("HYBRID_PD_KEEP_AFFINITY") and __import__("hybrid_pd.prefill.affinity_guard", fromlist=["install"]).install()' \
  > "$site/hybrid_pd_affinity_guard.pth"
