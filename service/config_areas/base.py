"""What every area of the settings shares: where its fields are read from."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

# The checkout the service runs from: the dev cluster's defaults live under it.
REPO_ROOT = Path(__file__).resolve().parents[2]

ENV_PREFIX = "RUNYARD_"


class AreaSettings(BaseSettings):
    """An area of the settings: each field is read from the environment variable
    RUNYARD_<FIELD> (in any case).

    The first line of an area's docstring is its heading in docs/install.md, the rest what
    it governs there."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")
