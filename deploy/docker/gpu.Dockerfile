# Workers on NVIDIA GPUs: vLLM's own image of the release the GPU results ran on (0.26.0: torch 2.11, CUDA 13;
# deploy/gpu/build_wheelhouse.sh), plus NIXL for CUDA 13 and hybrid-pd. Build from the repository root:
#   docker build -f deploy/docker/gpu.Dockerfile -t ghcr.io/hybrid-pd/hybrid-pd:0.1.0-cu13 .
# AWS EFA (overlays/gpu-efa): --build-arg EFA_INSTALLER_VERSION=1.38.0, tag 0.1.0-cu13-efa (libfabric's EFA
# provider for NIXL's LIBFABRIC backend).
# Base images by digest: the tag says what it is, the digest what is built on. The digest is a public pin
# of the tag, not read from a registry here (none is reachable): the first build verifies it
# (docker buildx imagetools inspect TAG), and a newer base is a deliberate change of digest.
FROM vllm/vllm-openai:v0.26.0@sha256:ffb2d59b1c059a5bd8d781320c9f5189de8293693b7d95da54befddaa54abf52
ARG EFA_INSTALLER_VERSION=
RUN if [ -n "$EFA_INSTALLER_VERSION" ]; then \
      cd /tmp && curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-$EFA_INSTALLER_VERSION.tar.gz" | tar xz \
      && cd aws-efa-installer && ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify \
      && rm -rf /tmp/aws-efa-installer; fi
WORKDIR /src
COPY pyproject.toml README.md ./
COPY prefill prefill
COPY decode decode
COPY proxy proxy
COPY connector connector
# vLLM stays the image's own (pinned so pip cannot move it). The other pins are build_wheelhouse.sh's, found
# necessary on the H100 run: `nixl` pulls the CUDA 12 build, replaced by nixl-cu13; xgrammar 0.2.8 fails to
# load with tvm-ffi 0.1.10; compressed-tensors needs loguru.
RUN python3 -m pip install --no-cache-dir "/src[gpu]" "vllm==0.26.0" "nixl==1.5.1" "nixl-cu13==1.5.1" \
        "apache-tvm-ffi==0.1.10" "xgrammar==0.2.7" loguru \
    && (python3 -m pip uninstall -y nixl-cu12 || true) \
    && rm -rf /src
# The KV transfer's userspace, checked in the image it ships in: NIXL's UCX backend and UCX's InfiniBand/RoCE
# transport (libibverbs and libmlx5 come with nixl-cu13); with EFA, libfabric's EFA provider and NIXL's
# LIBFABRIC backend. gdrcopy: reported, not needed (check_nixl.py says why).
COPY deploy/docker/check_nixl.py /opt/hybrid-pd/check_nixl.py
RUN python3 /opt/hybrid-pd/check_nixl.py --fabric "$([ -n "$EFA_INSTALLER_VERSION" ] && echo efa || echo ib)"
RUN useradd --uid 1000 --create-home --home-dir /home/hybrid-pd hybrid-pd
ENV HOME=/home/hybrid-pd
USER 1000
# vLLM's image starts `vllm serve`; the manifests run `hybrid-pd prefill|decode`.
ENTRYPOINT []
