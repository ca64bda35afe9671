# The routing proxy alone: no CUDA, no vLLM, no torch; only the proxy's dependencies (pyproject's
# `dependencies`: msgspec, pyzmq, aiohttp, httptools, uvicorn, uvloop, prometheus-client) and its `tokenizer` extra
# (transformers without torch: it tokenizes prompts itself, from the workers' model volume, instead of asking a
# worker's /tokenize per request). Build from the repository root:
#   docker build -f deploy/docker/proxy.Dockerfile -t ghcr.io/hybrid-pd/hybrid-pd-proxy:0.1.0 .
# tests/deploy/test_dockerfiles.py replays the build stage's COPY and RUN lines in a temporary folder.
# Base images by digest: the tag says what it is, the digest what is built on. The digest is a public pin
# of the tag, not read from a registry here (none is reachable): the first build verifies it
# (docker buildx imagetools inspect TAG), and a newer base is a deliberate change of digest.
FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7 AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY deploy/docker/constraints.txt ./
COPY prefill prefill
COPY decode decode
COPY proxy proxy
COPY connector connector
# -c: every transitive dependency at the version CI ran (constraints.txt)
RUN python -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir -c constraints.txt "/src[tokenizer]"

FROM python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7
# UID 1000: the manifests' runAsUser (runAsNonRoot needs a numeric user)
RUN useradd --uid 1000 --create-home --home-dir /home/hybrid-pd hybrid-pd
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH HOME=/home/hybrid-pd PYTHONDONTWRITEBYTECODE=1
USER 1000
EXPOSE 8000
CMD ["hybrid-pd", "proxy", "--help"]
