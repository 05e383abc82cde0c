# The HyCache agent image: Debian bookworm-slim, fuse3, and the uv workspace (hycache-core,
# hycache-agent, hycache-dht, hycache-harness) installed from uv.lock into /opt/hycache/.venv.
#
#   docker build -f deploy/agent.Dockerfile -t hycache-agent:dev .    # context: the repo root
#
# Running it needs /dev/fuse and CAP_SYS_ADMIN (see docker-compose.yml). The entry point
# (deploy/agent-entrypoint.sh) takes `hycache-agent` arguments.
# Only the files named by COPY below are sent (deploy/agent.Dockerfile.dockerignore);
# tests/deploy/test_compose.py replays the COPY and `uv sync` steps of the build stage.

# No `# syntax=` line: the Dockerfile frontend built into the engine (BuildKit) is used,
# so nothing is pulled for it (RUN --mount=type=cache/secret are in it since Engine 18.09).
#
# Base images are build arguments with the official images as defaults; docker-compose.yml
# passes HYCACHE_BASE_IMAGE / HYCACHE_UV_IMAGE, which deploy/local-images.sh points at
# images built from Debian's archive where no registry is reachable.
# Build secret `ca_bundle` (optional; compose: HYCACHE_CA_BUNDLE): an extra CA bundle that
# pip and uv trust for PyPI, for networks behind a TLS-inspecting proxy.

# Keep in step with scripts/versions.env (UV_VERSION); tests/deploy checks it.
ARG UV_VERSION=0.9.30
ARG HYCACHE_UV_IMAGE=ghcr.io/astral-sh/uv:${UV_VERSION}
ARG HYCACHE_BASE_IMAGE=debian:bookworm-slim

FROM ${HYCACHE_UV_IMAGE} AS uv

# ------------------------------------------------------------------ build stage
FROM ${HYCACHE_BASE_IMAGE} AS build
# pyfuse3 is a source distribution: it compiles against the private libfuse 3.17 below
# (pkg-config, cc). No libfuse3-dev: the linker would find its libfuse3.so (3.14) first;
# build-libfuse.sh fetches the pyfuse3 sdist with pip. liburing-dev: FUSE over io_uring,
# linked into pyfuse3 statically (nothing more in the runtime image).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
        python3 python3-dev python3-pip gcc libc6-dev pkg-config ca-certificates \
        dpkg-dev meson ninja-build patch liburing-dev \
 && rm -rf /var/lib/apt/lists/*
# hycache-ca: run a command trusting the build secret's CA bundle too, when one is given
RUN printf '%s\n' '#!/bin/sh' \
        'if [ -s /run/secrets/ca_bundle ]; then' \
        '  export SSL_CERT_FILE=/run/secrets/ca_bundle PIP_CERT=/run/secrets/ca_bundle' \
        '  export REQUESTS_CA_BUNDLE=/run/secrets/ca_bundle NODE_EXTRA_CA_CERTS=/run/secrets/ca_bundle' \
        'fi' 'exec "$@"' > /usr/local/bin/hycache-ca && chmod 755 /usr/local/bin/hycache-ca
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
RUN --mount=type=secret,id=ca_bundle \
    mkdir -p .work && cp -a "$(hycache-ca bash scripts/build-libfuse.sh /opt/hycache/tools uv)" .work/pyfuse3
# 1. third-party dependencies only: this layer is reused until uv.lock changes
COPY pyproject.toml uv.lock ./
COPY core/pyproject.toml core/pyproject.toml
COPY agent/pyproject.toml agent/pyproject.toml
COPY dht/pyproject.toml dht/pyproject.toml
COPY harness/pyproject.toml harness/pyproject.toml
# the control plane is a workspace member too: uv reads its pyproject, installs nothing of it
COPY backend/pyproject.toml backend/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=ca_bundle \
    hycache-ca uv sync --frozen --no-dev --package hycache-agent --no-install-workspace
# 2. the workspace packages, as wheels (the runtime image holds no source tree)
COPY core/src core/src
COPY agent/src agent/src
COPY dht/src dht/src
COPY harness/src harness/src
RUN --mount=type=cache,target=/root/.cache/uv --mount=type=secret,id=ca_bundle \
    hycache-ca uv sync --frozen --no-dev --package hycache-agent --no-editable

# ------------------------------------------------------------------ runtime stage
FROM ${HYCACHE_BASE_IMAGE}
# fuse3: /dev/fuse user space (fusermount3, libfuse3.so.3 for pyfuse3);
# python3: the venv's interpreter (/usr/bin/python3.11, as in the build stage).
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 fuse3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/hycache/.venv /opt/hycache/.venv
# the private libfuse 3.17 the patched pyfuse3 links to (rpath: the same path)
COPY --from=build /opt/hycache/tools/libfuse-3.17.2 /opt/hycache/tools/libfuse-3.17.2
COPY deploy/agent-entrypoint.sh /usr/local/bin/hycache-agent-entrypoint
RUN chmod 0755 /usr/local/bin/hycache-agent-entrypoint
ENV PATH=/opt/hycache/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1
# the agent-to-agent data service (--listen); each demo agent uses its own port
EXPOSE 7070-7079
ENTRYPOINT ["/usr/local/bin/hycache-agent-entrypoint"]
CMD ["--help"]
