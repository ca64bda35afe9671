#!/usr/bin/env bash
# Build an offline wheelhouse for the GPU machines (Python 3.12, torch 2.11.0+cu130 preinstalled, no package
# index): vLLM 0.26.0 (the newest release that pins torch 2.11.0), nixl-cu13, hybrid-pd itself, and every
# requirement the image lacks. Files over 58 MiB are split into parts so each fits one device call.
#   bash deploy/gpu/build_wheelhouse.sh OUT_DIR      (run where PyPI is reachable; ~400 MB)
# Then on the GPU machine: bash deploy/gpu/install_wheelhouse.sh OUT_DIR SITE_DIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:?output folder}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)  # absolute: step 4 cds into it
PY=${PYTHON:-python3}
PLAT=(--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform any)
for n in $(seq 17 39); do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done  # pip matches N exactly
# `nixl` is the importable front; it pulls nixl-cu12 too, which image-packages.txt leaves out (cu13 here).
# Pins the recipe found necessary: xgrammar 0.2.8 fails to load with tvm-ffi 0.1.10; compressed-tensors needs loguru.
WANT=("vllm==0.26.0" "nixl==1.5.1" "nixl-cu13==1.5.1" "apache-tvm-ffi==0.1.10" "xgrammar==0.2.7" loguru
      msgspec pyzmq "aiohttp>=3.9" "httptools>=0.6" "uvicorn>=0.53,<0.55" uvloop prometheus-client psutil)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# 1. Resolve the whole tree for the target platform without installing anything.
"$PY" -m pip install -q --dry-run --ignore-installed --target "$work/t" --report "$work/report.json" \
  "${PLAT[@]}" "${WANT[@]}"
# 2. Keep what the image lacks: walk the dependency graph from the roots, stopping at what the image has and
#    at what we leave out on purpose (so their own dependencies, often hundreds of MB, stay out too).
"$PY" - "$work/report.json" "$HERE/image-packages.txt" "${WANT[@]}" > "$work/pins.txt" <<'PYEOF'
import json, re, sys
from pip._vendor.packaging.requirements import Requirement
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
lines = [l for l in open(sys.argv[2]) if not l.startswith("#")]
stop = {norm(w) for l in lines for w in l.split()}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
found = {norm(i["metadata"]["name"]): i["metadata"] for i in json.load(open(sys.argv[1]))["install"]}
todo, keep, done = [(norm(r.name), frozenset(r.extras)) for r in map(Requirement, sys.argv[3:])], set(), set()
while todo:  # (name, extras asked of it): a requirement like pkg[extra] pulls the extra's dependencies too
    name, extras = todo.pop()
    if (name, extras) in done or name in stop or name not in found:
        continue
    done.add((name, extras))
    keep.add(name)
    for spec in found[name].get("requires_dist") or []:
        req = Requirement(spec)
        if req.marker is None or any(req.marker.evaluate(env | {"extra": e}) for e in {"", *extras}):
            todo.append((norm(req.name), frozenset(req.extras)))
for name in sorted(keep):
    print(f"{found[name]['name']}=={found[name]['version']}")
PYEOF
echo "carrying $(wc -l < "$work/pins.txt") packages"
"$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$OUT" -r "$work/pins.txt"
# 3. hybrid-pd itself (pure Python).
"$PY" -m pip wheel -q --no-deps -w "$OUT" "$ROOT"
# 4. Split big files; record checksums so the far side can verify the reassembly.
cd "$OUT"
sha256sum *.whl > SHA256SUMS
for f in *.whl; do
  if [ "$(stat -c %s "$f")" -gt $((58 * 1024 * 1024)) ]; then split -b 58m -d "$f" "$f.part"; rm "$f"; fi
done
du -sh "$OUT"; ls "$OUT" | head -100
