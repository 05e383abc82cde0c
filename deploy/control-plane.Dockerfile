#
# The HyCache control-plane image: Debian bookworm-slim, the uv workspace's
# hycache-control (with hycache-core, hycache-dht and hycache-harness) installed from uv.lock into
# /opt/hycache/.venv, and the dashboard (frontend/, built with Node.js) served at /.
#
#   docker build -f deploy/control-plane.Dockerfile -t hycache-control:dev .   # context: the repo root
#
# The entry point (deploy/control-plane-entrypoint.sh) takes `hycache-control` arguments.
# Only the files named by COPY below are sent (deploy/control-plane.Dockerfile.dockerignore).
# No `# syntax=` line: the engine's built-in Dockerfile frontend, nothing pulled for it.
# Base images are build arguments with the official images as defaults (docker-compose.yml
# passes HYCACHE_*_IMAGE; deploy/local-images.sh builds local stand-ins where no registry
# is reachable). Build secret `ca_bundle` (optional): an extra CA bundle that uv and npm
# trust, for networks behind a TLS-inspecting proxy.

# Keep in step with scripts/versions.env (UV_VERSION).
ARG UV_VERSION=0.9.30
ARG HYCACHE_UV_IMAGE=ghcr.io/astral-sh/uv:${UV_VERSION}
ARG HYCACHE_BASE_IMAGE=debian:bookworm-slim
ARG HYCACHE_NODE_IMAGE=node:20-bookworm-slim

FROM ${HYCACHE_UV_IMAGE} AS uv

# ------------------------------------------------------------------ dashboard
FROM ${HYCACHE_NODE_IMAGE} AS ui
WORKDIR /src/frontend
# dependencies only: this layer is reused until package-lock.json changes
COPY frontend/package.json frontend/package-lock.json ./
RUN --mount=type=cache,target=/root/.npm --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/ca_bundle; fi; \
    npm ci --no-audit --no-fund --loglevel=error
COPY frontend/index.html frontend/vite.config.ts frontend/tsconfig.json frontend/tsconfig.app.json frontend/tsconfig.node.json ./
COPY frontend/src src
RUN npm run build

# ------------------------------------------------------------------ build stage
FROM ${HYCACHE_BASE_IMAGE} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PYTHON=/usr/bin/python3.11 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/hycache/.venv \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy
WORKDIR /src
# 1. third-party dependencies of hycache-control only (reused until uv.lock changes);
# every workspace member's pyproject.toml is needed for the lock to resolve
COPY pyproject.toml uv.lock ./
COPY core/pyproject.toml core/pyproject.toml
COPY agent/pyproject.toml agent/pyproject.toml
COPY dht/pyproject.toml dht/pyproject.toml
COPY harness/pyproject.toml harness/pyproject.toml
COPY backend/pyproject.toml backend/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export SSL_CERT_FILE=/run/secrets/ca_bundle; fi; \
    uv sync --frozen --no-dev --no-install-workspace --package hycache-control
# 2. the packages it runs, as wheels
COPY core/src core/src
COPY dht/src dht/src
COPY harness/src harness/src
COPY backend/src backend/src
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=ca_bundle \
    if [ -s /run/secrets/ca_bundle ]; then export SSL_CERT_FILE=/run/secrets/ca_bundle; fi; \
    uv sync --frozen --no-dev --no-editable --package hycache-control

# ------------------------------------------------------------------ runtime stage
FROM ${HYCACHE_BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/hycache/.venv /opt/hycache/.venv
COPY --from=ui /src/frontend/dist /opt/hycache/ui
COPY deploy/control-plane-entrypoint.sh /usr/local/bin/hycache-control-entrypoint
RUN chmod 0755 /usr/local/bin/hycache-control-entrypoint
ENV PATH=/opt/hycache/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HYCACHE_CONTROL_UI_DIR=/opt/hycache/ui
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/hycache-control-entrypoint"]
CMD ["--help"]
