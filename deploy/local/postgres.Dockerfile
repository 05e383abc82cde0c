# hycache-local/postgres:15 — stands in for postgres:16-bookworm where no registry is
# reachable (deploy/local-images.sh builds it): Debian bookworm's PostgreSQL 15 with an
# entry point that honours the official image's POSTGRES_USER, POSTGRES_DB,
# POSTGRES_PASSWORD(_FILE) and PGDATA (initdb on an empty volume, then the server as the
# postgres user). The control plane runs on either (SQLAlchemy + psycopg, no 16-only SQL).
ARG BASE=hycache-local/debian:bookworm
FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["sh", "/usr/local/bin/docker-entrypoint.sh"]
CMD ["postgres"]
