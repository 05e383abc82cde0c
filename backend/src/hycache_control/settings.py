"""Settings: command-line flags > environment (``HYCACHE_CONTROL_*``) > TOML file > defaults."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

#: secrets nobody may use outside --dev
UNSAFE_SECRETS = frozenset({"", "admin", "changeme", "change-me", "secret", "password", "hycache", "token", "dev"})
MIN_SECRET_LENGTH = 24


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HYCACHE_CONTROL_", extra="forbid")

    listen: str = Field("127.0.0.1:8080", description="HOST:PORT the API listens on")
    state_dir: Path = Field(Path("/var/lib/hycache-control"), description="where the default SQLite file lives")
    db: str | None = Field(None, description="SQLAlchemy URL (sqlite:///FILE or postgresql+psycopg://...); "
                                             "default: SQLite under state_dir")
    redis: str | None = Field(None, description="Redis Cluster seeds HOST:PORT,... (the agents' DHT); none: no namespace view")
    dht_namespace: str = Field("hc", description="the agents' dht_namespace (key prefix)")
    redis_user: str | None = Field(None, description="Redis ACL user of the control plane (default: Redis's default user)")
    redis_password_file: Path | None = Field(None, description="file holding redis_user's password (mode 0600)")
    ui_dir: Path | None = Field(None, description="built dashboard (default: frontend/dist next to the package's repository)")
    dev: bool = Field(False, description="development mode: accept default/unsafe secrets")
    admin_token: str | None = Field(None, description="an admin token to install at start (for deployments)")
    admin_token_file: Path | None = Field(None, description="file holding admin_token (mode 0600)")
    metrics_require_token: bool = Field(False, description="require a read token on GET /metrics")
    heartbeat_interval: float = Field(1.0, gt=0, le=60, description="the shortest interval the agents are told to "
                                                                       "use (s); stretched to keep the cluster's "
                                                                       "rate under max_heartbeats_per_second")
    max_heartbeats_per_second: float = Field(1000.0, gt=0, description="cap of the cluster's heartbeat rate: the "
                                             "interval handed to agents is max(heartbeat_interval, "
                                             "nodes / this) (Nomad's rule)")
    down_after_missed: int = Field(3, ge=1, description="a node is down after this many missed heartbeats (+ grace)")
    down_grace: float = Field(2.0, ge=0, description="seconds added to the missed-heartbeat window")
    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger request bodies get 413")
    max_manifest_bytes: int = Field(64 << 20, ge=1024,
                                    description="bound of a POST /api/v1/manifests body, after gzip decompression "
                                                "(real WfCommons instances run to tens of MB)")
    raw_retention_s: float = Field(3600.0, gt=0, description="1 s samples are kept this long")
    minute_retention_s: float = Field(7 * 86400.0, gt=0, description="1 min samples are kept this long")
    flush_interval: float = Field(0.5, gt=0, le=10, description="metric writer flush period (s)")
    token_cache_seconds: float = Field(5.0, ge=0, description="how long a token lookup is cached")
    log_level: str = Field("info")
    workers: int = Field(1, ge=1, le=64, description="server processes on this host (serve --workers; >1 needs "
                                                     "PostgreSQL: the processes share state through it)")

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError("listen must be HOST:PORT")
        return v

    @field_validator("dht_namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        from hycache_dht import keys
        keys.check_namespace(v)
        return v

    @model_validator(mode="after")
    def _secrets(self) -> Settings:
        if self.admin_token_file is not None and self.admin_token is None:
            st = self.admin_token_file.stat()
            if st.st_mode & 0o077:
                raise ValueError(f"admin_token_file {self.admin_token_file} must not be readable by group/others "
                                 f"(mode {st.st_mode & 0o777:o}; chmod 600)")
            self.admin_token = self.admin_token_file.read_text().strip()
        if self.admin_token is not None and not self.dev:
            if self.admin_token.lower() in UNSAFE_SECRETS or len(self.admin_token) < MIN_SECRET_LENGTH:
                raise ValueError(f"admin_token is a default or short secret (need >= {MIN_SECRET_LENGTH} "
                                 "random characters; --dev accepts it)")
        return self

    @property
    def redis_password(self) -> str | None:
        """The password in redis_password_file (refused when group/others can read it)."""
        if self.redis_password_file is None:
            return None
        st = self.redis_password_file.stat()
        if st.st_mode & 0o077:
            raise ValueError(f"redis_password_file {self.redis_password_file} must not be readable by group/others "
                             f"(mode {st.st_mode & 0o777:o}; chmod 600)")
        password = self.redis_password_file.read_text().strip()
        if not password:
            raise ValueError(f"redis_password_file {self.redis_password_file} is empty")
        return password

    @property
    def db_url(self) -> str:
        return self.db or f"sqlite:///{self.state_dir / 'control.db'}"

    @property
    def redis_seeds(self) -> list[tuple[str, int]]:
        out = []
        for item in (self.redis or "").split(","):
            item = item.strip()
            if item:
                host, _, port = item.rpartition(":")
                out.append((host, int(port)))
        return out

    @property
    def down_after(self) -> float:
        """The down window at the base interval (a node's own window uses the interval it was
        last handed: NodeService)."""
        return self.down_after_missed * self.heartbeat_interval + self.down_grace


def load_settings(config: str | os.PathLike | None = None, **flags: Any) -> Settings:
    """Settings from flags (``None`` values are ignored), env, and an optional TOML file."""
    flags = {k: v for k, v in flags.items() if v is not None}
    toml_file = Path(config) if config else None
    if toml_file is not None and not toml_file.is_file():
        raise ValueError(f"config: no such file {toml_file}")

    class _FromFile(Settings):
        @classmethod
        def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                       file_secret_settings) -> tuple[PydanticBaseSettingsSource, ...]:
            sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
            if toml_file is not None:
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_file))
            return tuple(sources)

    s = _FromFile(**flags)
    return Settings.model_construct(**s.model_dump())
