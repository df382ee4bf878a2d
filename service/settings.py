"""Service settings (pydantic-settings), read from MATHRL_* environment variables.

Nested blocks use a double underscore: MATHRL_DATABASE__URL, MATHRL_WORKER__LEASE_SECONDS.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from mathrl.paths import default_data_dir


class DatabaseSettings(BaseModel):
    url: str = Field("sqlite:///./.mathrl/mathrl.db", description="SQLAlchemy URL (postgresql+psycopg://...).")


class BrokerSettings(BaseModel):
    url: str = Field("redis://127.0.0.1:6379/0", description="Celery broker URL (redis:// or sqla+sqlite://).")
    visibility_timeout: int = Field(3600, description="Redis: seconds before an unacked message is redelivered.")


class WorkerSettings(BaseModel):
    lease_seconds: float = Field(30.0, description="A claimed job's lease; renewed by the heartbeat.")
    heartbeat_seconds: float = Field(5.0, description="How often the supervisor renews the lease and checks cancel.")
    cancel_grace_seconds: float = Field(20.0, description="SIGTERM, then SIGKILL after this many seconds.")
    reconcile_seconds: float = Field(15.0, description="How often the reconciler re-delivers lost jobs.")
    redeliver_after_seconds: float = Field(60.0, description="A queued job unclaimed this long is sent again.")


class AuthSettings(BaseModel):
    admin_token: str | None = Field(None, description="Operator token that may create projects and their keys.")
    key_prefix: str = "mrl_"
    cache_seconds: float = Field(2.0, description="How long an API process trusts a key it has checked.")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MATHRL_", env_nested_delimiter="__", extra="ignore")

    database: DatabaseSettings = Field(default_factory=DatabaseSettings)  # type: ignore[arg-type]
    broker: BrokerSettings = Field(default_factory=BrokerSettings)  # type: ignore[arg-type]
    worker: WorkerSettings = Field(default_factory=WorkerSettings)  # type: ignore[arg-type]
    auth: AuthSettings = Field(default_factory=AuthSettings)  # type: ignore[arg-type]
    artifact_dir: str = Field("./.mathrl/artifacts", description="Checkpoints and per-item results.")
    data_dir: str = Field(default_factory=default_data_dir, description="Offline dataset copies.")
    max_request_bytes: int = 1_000_000


@lru_cache
def get_settings() -> Settings:
    return Settings()
