# hycache-local/node:20 — stands in for node:20-bookworm-slim where no registry is
# reachable (deploy/local-images.sh builds it): Debian trixie's nodejs (20.19) and npm.
# Only the dashboard's build stage (deploy/control-plane.Dockerfile) runs on it.
ARG BASE=hycache-local/debian:trixie
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm ca-certificates \
 && rm -rf /var/lib/apt/lists/*
CMD ["node"]
