# The routing proxy alone: no CUDA, no vLLM, no torch; only the proxy's dependencies (pyproject's
# `dependencies`: msgspec, pyzmq, aiohttp, httptools, uvicorn, uvloop, prometheus-client). Build from the repository root:
#   docker build -f deploy/docker/proxy.Dockerfile -t ghcr.io/hybrid-pd/hybrid-pd-proxy:0.1.0 .
# tests/deploy/test_dockerfiles.py replays the build stage's COPY and RUN lines in a temporary folder.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY prefill prefill
COPY decode decode
COPY proxy proxy
COPY connector connector
RUN python -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir /src

FROM python:3.11-slim
# UID 1000: the manifests' runAsUser (runAsNonRoot needs a numeric user)
RUN useradd --uid 1000 --create-home --home-dir /home/hybrid-pd hybrid-pd
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH HOME=/home/hybrid-pd PYTHONDONTWRITEBYTECODE=1
USER 1000
EXPOSE 8000
CMD ["hybrid-pd", "proxy", "--help"]
