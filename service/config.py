"""Service settings, read from RUNYARD_* environment variables.

`Settings` is every area of service/config_areas/ in one object: each area holds its own
fields, validators and what derives from them alone; here is only what spans areas.
"""

from __future__ import annotations

from functools import lru_cache

from sqlalchemy.engine import make_url

from service.config_areas.auth import AuthSettings
from service.config_areas.base import REPO_ROOT, AreaSettings
from service.config_areas.cluster import ClusterSettings
from service.config_areas.clusters import ClustersSettings
from service.config_areas.identity import IdentitySettings, ServiceEnvironment
from service.config_areas.node_health import NodeHealthSettings, SlowNodePolicy
from service.config_areas.notifications import NotificationSettings
from service.config_areas.observability import ObservabilitySettings
from service.config_areas.reconciler import ReconcilerSettings
from service.config_areas.recovery import RecoverySettings
from service.config_areas.replica_groups import ReplicaGroupSettings
from service.config_areas.server import ServerSettings
from service.config_areas.tls import TlsSettings
from service.config_areas.tracking import TrackingSettings

__all__ = [
    "AREAS",
    "REPO_ROOT",
    "ServiceEnvironment",
    "Settings",
    "SlowNodePolicy",
    "get_settings",
]


class Settings(
    ServerSettings,
    TlsSettings,
    AuthSettings,
    IdentitySettings,
    ClusterSettings,
    ClustersSettings,
    ReconcilerSettings,
    RecoverySettings,
    NodeHealthSettings,
    ReplicaGroupSettings,
    TrackingSettings,
    NotificationSettings,
    ObservabilitySettings,
):
    """One source of truth for everything an operator can tune: every area's settings."""

    @property
    def api_url(self) -> str:
        """Where workers and agents reach the API: public_url, else this host's address,
        HTTPS when the API serves it."""
        scheme = "https" if self.tls_cert_file is not None else "http"
        return self.public_url or f"{scheme}://{self.host}:{self.port}"

    @property
    def slurm_job_prefix(self) -> str:
        if self.job_prefix:
            return self.job_prefix
        # The database's name, not the URL's tail: a URL may carry a query (the dev
        # cluster's names its password file: ?passfile=...).
        return f"runyard-{make_url(self.database_url).database or 'runyard'}"

    @property
    def slow_node_floor_s(self) -> float:
        """slow_node_min_excess_s, or its default for the accelerator."""
        if self.slow_node_min_excess_s is not None:
            return self.slow_node_min_excess_s
        return 0.1 if self.accelerator == "cpu" else 0.001


# The areas in the order docs/install.md lists them: Settings' bases.
AREAS: tuple[type[AreaSettings], ...] = tuple(
    base for base in Settings.__bases__ if issubclass(base, AreaSettings)
)


@lru_cache
def get_settings() -> Settings:
    return Settings()
