"""All tables, imported in one place so Alembic and the app see the same metadata."""

from service.models.auth import ApiToken, AuditEntry, Role, Team, TokenOrigin
from service.models.base import Base
from service.models.identity import UserLink
from service.models.incident import (
    ClassicBecause,
    ClusterSetting,
    Incident,
    IncidentState,
    RecoveryAction,
    RecoveryPath,
)
from service.models.node import Node, NodeEvent, NodeState
from service.models.notification import (
    DeliveryState,
    NotificationDelivery,
    NotificationEvent,
    NotificationFormat,
    NotificationSubscription,
)
from service.models.plan_outcome import PlanOutcome
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
from service.models.tracking import ExportState, TrackerExport, TrackerKind

__all__ = [
    "ApiToken",
    "Attempt",
    "AttemptState",
    "AuditEntry",
    "Base",
    "Checkpoint",
    "CheckpointState",
    "ClassicBecause",
    "ClusterSetting",
    "DeliveryState",
    "ExportState",
    "Incident",
    "IncidentState",
    "Metric",
    "Node",
    "NodeEvent",
    "NodeState",
    "NotificationDelivery",
    "NotificationEvent",
    "NotificationFormat",
    "NotificationSubscription",
    "PlanOutcome",
    "RecoveryAction",
    "RecoveryPath",
    "Role",
    "Run",
    "RunEvent",
    "RunState",
    "Sweep",
    "Team",
    "TokenOrigin",
    "TrackerExport",
    "TrackerKind",
    "UserLink",
]
