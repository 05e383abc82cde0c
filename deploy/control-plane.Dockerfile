# syntax=docker/dockerfile:1
#
# The HyCache control-plane image: Debian bookworm-slim and the uv workspace's
# hycache-control (with hycache-core and hycache-dht) installed from uv.lock into
# /opt/hycache/.venv.
#
#   docker build -f deploy/control-plane.Dockerfile -t hycache-control:dev .   # context: the repo root
#
# The entry point (deploy/control-plane-entrypoint.sh) takes `hycache-control` arguments.
# Only the files named by COPY below are sent (deploy/control-plane.Dockerfile.dockerignore).

# Keep in step with scripts/versions.env (UV_VERSION).
ARG UV_VERSION=0.9.30

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

# ------------------------------------------------------------------ build stage
FROM debian:bookworm-slim AS build
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
COPY backend/pyproject.toml backend/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-install-workspace --package hycache-control
# 2. the packages it runs, as wheels
COPY core/src core/src
COPY dht/src dht/src
COPY backend/src backend/src
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --no-editable --package hycache-control

# ------------------------------------------------------------------ runtime stage
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/hycache/.venv /opt/hycache/.venv
COPY --chmod=0755 deploy/control-plane-entrypoint.sh /usr/local/bin/hycache-control-entrypoint
ENV PATH=/opt/hycache/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/hycache-control-entrypoint"]
CMD ["--help"]
