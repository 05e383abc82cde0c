# hycache-local/redis:7 — stands in for redis:7.2-bookworm where no registry is reachable
# (deploy/local-images.sh builds it): Debian bookworm's redis-server (7.0), run as the
# redis user from /data like the official image (which starts as root and drops to redis:
# so does deploy/redis/redis-start.sh, after reading the root-only password secrets).
# docker-compose.yml uses only redis-server, redis-cli, sh and setpriv from it.
ARG BASE=hycache-local/debian:bookworm
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server redis-tools \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /data /usr/local/etc/redis && chown redis:redis /data
WORKDIR /data
EXPOSE 6379
CMD ["redis-server"]
