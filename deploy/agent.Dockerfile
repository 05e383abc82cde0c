# syntax=docker/dockerfile:1
#
# The HyCache agent image: Debian bookworm-slim, fuse3, and the uv workspace (hycache-core,
# hycache-agent, hycache-dht) installed from uv.lock into /opt/hycache/.venv.
#
#   docker build -f deploy/agent.Dockerfile -t hycache-agent:dev .    # context: the repo root
#
# Running it needs /dev/fuse and CAP_SYS_ADMIN (see docker-compose.yml). The entry point
# (deploy/agent-entrypoint.sh) takes `hycache-agent` arguments.
# Only the files named by COPY below are sent (deploy/agent.Dockerfile.dockerignore);
# tests/deploy/test_compose.py replays the COPY and `uv sync` steps of the build stage.

# Keep in step with scripts/versions.env (UV_VERSION); tests/deploy checks it.
ARG UV_VERSION=0.9.30

FROM ghcr.io/astral-sh/uv:${UV_VERSION} AS uv

# ------------------------------------------------------------------ build stage
FROM debian:bookworm-slim AS build
# pyfuse3 is a source distribution: it compiles against libfuse3 (headers, pkg-config, cc).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        python3 python3-dev gcc libc6-dev libfuse3-dev pkg-config ca-certificates \
        dpkg-dev meson ninja-build patch \
 && rm -rf /var/lib/apt/lists/*
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_PYTHON=/usr/bin/python3.11 \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/opt/hycache/.venv \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy
WORKDIR /src
# 0. libfuse 3.17 (FUSE passthrough) from Debian trixie's source package into a private
#    prefix, and pyfuse3 patched for it in .work/pyfuse3, the path uv.lock names — the
#    same script as scripts/bootstrap.sh (docs/agent.md, "Kernel FUSE passthrough")
COPY scripts/build-libfuse.sh scripts/versions.env scripts/
COPY agent/patches agent/patches
RUN mkdir -p .work && cp -a "$(bash scripts/build-libfuse.sh /opt/hycache/tools uv)" .work/pyfuse3
# 1. third-party dependencies only: this layer is reused until uv.lock changes
COPY pyproject.toml uv.lock ./
COPY core/pyproject.toml core/pyproject.toml
COPY agent/pyproject.toml agent/pyproject.toml
COPY dht/pyproject.toml dht/pyproject.toml
# the control plane is a workspace member too: uv reads its pyproject, installs nothing of it
COPY backend/pyproject.toml backend/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package hycache-agent --no-install-workspace
# 2. the workspace packages, as wheels (the runtime image holds no source tree)
COPY core/src core/src
COPY agent/src agent/src
COPY dht/src dht/src
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package hycache-agent --no-editable

# ------------------------------------------------------------------ runtime stage
FROM debian:bookworm-slim
# fuse3: /dev/fuse user space (fusermount3, libfuse3.so.3 for pyfuse3);
# python3: the venv's interpreter (/usr/bin/python3.11, as in the build stage).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 fuse3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/hycache/.venv /opt/hycache/.venv
# the private libfuse 3.17 the patched pyfuse3 links to (rpath: the same path)
COPY --from=build /opt/hycache/tools/libfuse-3.17.2 /opt/hycache/tools/libfuse-3.17.2
COPY --chmod=0755 deploy/agent-entrypoint.sh /usr/local/bin/hycache-agent-entrypoint
ENV PATH=/opt/hycache/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1
# the agent-to-agent data service (--listen); each demo agent uses its own port
EXPOSE 7070-7079
ENTRYPOINT ["/usr/local/bin/hycache-agent-entrypoint"]
CMD ["--help"]
