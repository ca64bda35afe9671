"""Check, at image build time, that NIXL and the RDMA userspace the overlays rely on load in this image.

    python3 check_nixl.py                  # NIXL's UCX backend, and UCX's InfiniBand/RoCE transport
    python3 check_nixl.py --fabric efa     # also libfabric with its EFA provider, and NIXL's LIBFABRIC backend

What is checked is what can be checked without a NIC: every library loads (libibverbs and libmlx5 come with
the nixl-cu13 wheel, beside UCX's transports; libfabric comes from the EFA installer) and NIXL creates the
backends. Whether a fabric works is a run's question (tests on the RDMA machines). gdrcopy is reported, not
required: UCX uses it only for small host<->GPU copies; the KV transfers are GPU-to-GPU RDMA (GPUDirect, the
nvidia-peermem module on the host) or cuda_ipc within a node.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import os
import sys


def ucx_ib_transport() -> str:
    """Load UCX's InfiniBand transport module from the UCX of the NIXL build that loads (nixl_cu13 in the GPU
    image: `nixl` picks one); its path."""
    from nixl import _api

    package = os.path.dirname(os.path.realpath(_api.__file__))  # .../site-packages/nixl_cu13
    found = sorted(glob.glob(os.path.join(f"{package}.libs", "ucx", "libuct_ib.so*")))
    if not found:
        raise RuntimeError(f"no UCX InfiniBand transport (libuct_ib.so) in {package}.libs/ucx")
    ctypes.CDLL(found[0], mode=ctypes.RTLD_GLOBAL)  # fails if libibverbs or libmlx5 cannot load
    return found[0]


def backends(names: list[str]) -> list[str]:
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent("image-check", nixl_agent_config(backends=[]))
    missing = [n for n in names if n not in agent.get_plugin_list()]
    if missing:
        raise RuntimeError(f"NIXL has no plugin for {missing} (has {agent.get_plugin_list()})")
    for name in names:
        agent.create_backend(name)
    return names


def libfabric_efa() -> str:
    path = ctypes.util.find_library("fabric") or next(iter(glob.glob("/opt/amazon/efa/lib*/libfabric.so*")), None)
    if path is None:
        raise RuntimeError("no libfabric: build with --build-arg EFA_INSTALLER_VERSION=...")
    ctypes.CDLL(path)
    real = os.path.realpath(path)
    dl_providers = glob.glob(os.path.join(os.path.dirname(real), "libfabric", "*efa*"))  # a loadable provider
    with open(real, "rb") as f:
        built_in = b"efa" in f.read()  # the EFA installer builds its provider into libfabric itself
    if not dl_providers and not built_in:
        raise RuntimeError(f"{path} has no EFA provider")
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fabric", choices=["ib", "efa"], default="ib")
    ap.add_argument("--backend", action="append", default=None, help="NIXL backends to create (UCX)")
    args = ap.parse_args(argv)
    wanted = args.backend or (["UCX", "LIBFABRIC"] if args.fabric == "efa" else ["UCX"])
    try:
        print(f"[check_nixl] UCX InfiniBand/RoCE transport loads: {ucx_ib_transport()}")
        if args.fabric == "efa":
            print(f"[check_nixl] libfabric with EFA: {libfabric_efa()}")
        print(f"[check_nixl] NIXL backends created: {', '.join(backends(wanted))}")
    except (OSError, RuntimeError, ImportError) as e:
        print(f"[check_nixl] FAILED: {e}", file=sys.stderr)
        return 1
    gdr = ctypes.util.find_library("gdrapi")
    print(f"[check_nixl] gdrcopy: {gdr or 'absent (optional: UCX uses it for small host<->GPU copies only)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
