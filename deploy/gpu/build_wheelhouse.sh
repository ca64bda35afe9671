#!/usr/bin/env bash
# Build an offline wheelhouse for the GPU machines (Python 3.12, torch 2.11.0+cu130 preinstalled, no package
# index): vLLM, nixl-cu13, hybrid-pd itself, and every requirement the image lacks or has at a version that won't
# do. Files over 58 MiB are split into parts so each fits one device call.
#   bash deploy/gpu/build_wheelhouse.sh OUT_DIR             (where PyPI is reachable; PYTHON: a Python 3.12)
#   VLLM=0.33.0 bash deploy/gpu/build_wheelhouse.sh OUT_DIR (default 0.26.0)
# VLLM=0.26.0: the newest release that pins torch 2.11.0, so the image's torch serves it (~400 MB).
# VLLM=0.33.0: pins torch 2.14.0, whose PyPI wheel is the cu13 build (cuda-toolkit 13.0.3), as is vLLM's own
#   (its kernels link libcudart.so.13): carries torch, triton 3.8, torchvision 0.29 and NCCL 2.30.7 (torch 2.14
#   needs ncclCommResume, which the image's 2.28.9 lacks) and cuDNN 9.24 (torch refuses the image's 9.19:
#   "compiled against (9, 24, 0) but found runtime version (9, 19, 0)"); the image's other CUDA 13 libraries
#   serve torch 2.14 though its pins name newer patch releases (cuBLAS 13.1.0.3 for 13.1.1.3, cuSPARSELt 0.8.0
#   for 0.8.1: it loads against them). ACCEPT_IMAGE=nvidia-cudnn-cu13 leaves cuDNN out too (-527 MiB): only
#   for models that never reach cuDNN (convolutions, cuDNN attention), such as the text-only hybrids here.
# Then on the GPU machine: bash deploy/gpu/install_wheelhouse.sh OUT_DIR SITE_DIR
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
OUT=${1:?output folder}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)  # absolute: step 4 cds into it
PY=${PYTHON:-python3.12}  # pip evaluates markers such as python_version > "3.11" for the resolving interpreter
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12), "PYTHON must be a Python 3.12"'
PLAT=(--python-version 3.12 --implementation cp --only-binary=:all: --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform any)
for n in $(seq 17 39); do PLAT+=(--platform "manylinux_2_${n}_x86_64"); done  # pip matches N exactly
# `nixl` is the importable front; it pulls nixl-cu12 too, which image-packages.txt leaves out (cu13 here).
# After vLLM and NIXL: hybrid-pd's own requirements. ACCEPT: image packages taken at their version although a
# pin asks for another (numpy: mistral-common caps it below 2.4, which the image's 2.5.2 served vLLM 0.26 through;
# an older numpy ahead of the image's would sit under its compiled packages). CARRY: image packages of unknown
# version that vLLM 0.33's tree wants at releases of autumn 2026 (pydantic: typing-extensions>=4.16; vLLM:
# certifi>=2026.10.19, pillow>=13, aiohttp>=3.14.4, ...): ~10 MiB, so not left to chance.
case ${VLLM:=0.26.0} in
  0.26.0)  # found necessary: xgrammar 0.2.8 fails to load with tvm-ffi 0.1.10; compressed-tensors needs loguru
    WANT=("vllm==0.26.0" "nixl==1.5.1" "nixl-cu13==1.5.1" "apache-tvm-ffi==0.1.10" "xgrammar==0.2.7" loguru)
    ACCEPT=(numpy) CARRY=() ;;
  0.33.0)
    WANT=("vllm==0.33.0" "nixl==1.5.1" "nixl-cu13==1.5.1" loguru)
    ACCEPT=(numpy cuda-toolkit nvidia-cublas nvidia-cusparselt-cu13)
    CARRY=(typing-extensions certifi filelock idna requests pillow aiohttp multidict) ;;
  *) echo "no recipe for vLLM $VLLM: 0.26.0 or 0.33.0" >&2; exit 2 ;;
esac
WANT+=(msgspec pyzmq "aiohttp>=3.9" "httptools>=0.6" "uvicorn>=0.53,<0.55" uvloop prometheus-client psutil)
ACCEPT+=(${ACCEPT_IMAGE:-})
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# 1. Resolve the whole tree for the target platform without installing anything.
"$PY" -m pip install -q --dry-run --ignore-installed --target "$work/t" --report "$work/report.json" \
  "${PLAT[@]}" "${WANT[@]}"
# 2. Keep what the image lacks or has at a version that won't do: walk the dependency graph from the roots,
#    stopping at what the image has and at what we leave out on purpose (so their own dependencies, often
#    hundreds of MB, stay out too). What it decided about the image's packages goes to stderr.
"$PY" "$HERE/wheelhouse_pins.py" "$work/report.json" "$HERE/image-packages.txt" \
  "${ACCEPT[@]/#/--accept=}" "${CARRY[@]/#/--carry=}" -- "${WANT[@]}" > "$work/pins.txt"
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
