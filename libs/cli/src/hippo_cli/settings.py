"""Settings of the `hippo` command (environment prefix `HIPPO_CLI_`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class CliSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HIPPO_CLI_", extra="forbid", frozen=True)

    embedding_addr: str = Field(
        "127.0.0.1:50052", description="Where `hippo embed` and `hippo health` reach embedding."
    )
    timeout_seconds: float = Field(10.0, gt=0, description="Deadline of each CLI call.")
    data_dir: str = Field(
        "var", description="Where `hippo up` keeps service data and logs (relative to cwd)."
    )
    startup_timeout_seconds: float = Field(
        300.0, gt=0, description="How long `hippo up` waits for each service to be SERVING."
    )
