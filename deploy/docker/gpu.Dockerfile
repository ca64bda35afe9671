# Workers on NVIDIA GPUs: vLLM's own image of the release the GPU results ran on (0.26.0: torch 2.11, CUDA 13;
# deploy/gpu/build_wheelhouse.sh), plus NIXL for CUDA 13 and hybrid-pd. Build from the repository root:
#   docker build -f deploy/docker/gpu.Dockerfile -t ghcr.io/hybrid-pd/hybrid-pd:0.1.0-cu13 .
# AWS EFA (overlays/gpu-efa): --build-arg EFA_INSTALLER_VERSION=1.38.0, tag 0.1.0-cu13-efa (libfabric's EFA
# provider for NIXL's LIBFABRIC backend).
FROM vllm/vllm-openai:v0.26.0
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
RUN useradd --uid 1000 --create-home --home-dir /home/hybrid-pd hybrid-pd
ENV HOME=/home/hybrid-pd
USER 1000
# vLLM's image starts `vllm serve`; the manifests run `hybrid-pd prefill|decode`.
ENTRYPOINT []
