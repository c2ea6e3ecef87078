"""All tables, imported in one place so Alembic and the app see the same metadata."""

from service.models.auth import ApiToken, AuditEntry, Role, Team
from service.models.base import Base
from service.models.identity import UserLink
from service.models.incident import ClusterSetting, Incident, IncidentState, RecoveryAction
from service.models.node import Node, NodeEvent, NodeState
from service.models.run import (
    Attempt,
    AttemptState,
    Checkpoint,
    CheckpointState,
    Metric,
    Run,
    RunEvent,
    RunState,
)
from service.models.sweep import Sweep

__all__ = [
    "ApiToken",
    "Attempt",
    "AttemptState",
    "AuditEntry",
    "Base",
    "Checkpoint",
    "CheckpointState",
    "ClusterSetting",
    "Incident",
    "IncidentState",
    "Metric",
    "Node",
    "NodeEvent",
    "NodeState",
    "RecoveryAction",
    "Role",
    "Run",
    "RunEvent",
    "RunState",
    "Sweep",
    "Team",
    "UserLink",
]
