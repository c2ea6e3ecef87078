"""/v1/admin: what on-call uses. Admin tokens only; every change is in the audit log."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Query, status
from sqlalchemy import select

from service.admin import service as admin
from service.admin.schemas import (
    AuditOut,
    IncidentOut,
    SparePool,
    SparePoolUpdate,
    TeamOut,
    TeamQuota,
    TokenCreate,
    TokenCreated,
)
from service.auth import service as auth
from service.auth.deps import ADMINS, PrincipalDep
from service.auth.schemas import TokenOut
from service.clusters.deps import ClusterQuery, cluster_name
from service.clusters.registry import find_cluster, target_of
from service.config import get_settings
from service.db import SessionDep
from service.errors import DbId, InvalidSpec
from service.models import Incident, Role
from service.models.base import utcnow
from service.nodes import service as nodes
from service.nodes.schemas import DrainRequest, NodeOut, ResumeRequest
from service.recovery import spares
from service.slurm import commands

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[ADMINS])


@router.post("/nodes/{name}/drain", status_code=status.HTTP_202_ACCEPTED)
def drain(
    name: str,
    body: DrainRequest,
    session: SessionDep,
    principal: PrincipalDep,
    cluster: ClusterQuery = None,
) -> IncidentOut | None:
    """Drain a node; a run on it moves to a spare like after a hardware failure."""
    incident = admin.request_drain(session, cluster_name(cluster), name, body.reason)
    auth.audit(session, principal, "node.drain", name, {"reason": body.reason})
    return incident_out(incident) if incident else None


@router.post("/nodes/{name}/resume")
def resume(
    name: str,
    body: ResumeRequest,
    session: SessionDep,
    principal: PrincipalDep,
    cluster: ClusterQuery = None,
) -> NodeOut:
    """Return a drained node to service (only runyard's own drains unless forced)."""
    config = find_cluster(get_settings(), cluster)
    target = target_of(get_settings(), config)
    nodes.require_node(session, config.name, name)
    session.rollback()  # no transaction stays open across the Slurm calls below
    slurm = next((n for n in commands.show_nodes(target) if n.name == name), None)
    reason = slurm.reason if slurm else ""
    # Resuming a node Slurm already runs is a no-op for Slurm, not an error for the admin.
    needs_slurm = slurm is not None and any(s in slurm.state for s in ("DRAIN", "DOWN", "FAIL"))
    node = nodes.require_node(session, config.name, name, for_update=True)
    nodes.check_resumable(node, reason, body.force)
    session.rollback()
    if needs_slurm:
        commands.resume_node(target, name)
    node = nodes.require_node(session, config.name, name, for_update=True)
    nodes.mark_resumed(session, node, body.force)
    auth.audit(
        session, principal, "node.resume", name, {"force": body.force, "slurm_reason": reason}
    )
    return NodeOut.model_validate(node)


@router.get("/spares")
def get_spares(session: SessionDep, cluster: ClusterQuery = None) -> SparePool:
    """A cluster's spare pool: its target size and current members."""
    on = cluster_name(cluster)
    target = spares.get_target(session, on, spares.configured_target(get_settings(), on))
    members = [n.name for n in spares.spare_nodes(session, on)]
    return SparePool(cluster=on, target=target, members=members)


@router.put("/spares")
def set_spares(
    body: SparePoolUpdate,
    session: SessionDep,
    principal: PrincipalDep,
    cluster: ClusterQuery = None,
) -> SparePool:
    """Set a cluster's spare pool target; the reconciler fills or shrinks it within a tick."""
    on = cluster_name(cluster)
    before = spares.get_target(session, on, spares.configured_target(get_settings(), on))
    spares.set_target(session, on, body.target)
    change = {"cluster": on, "from": before, "to": body.target}
    auth.audit(session, principal, "spares.set", "spare pool", change)
    members = [n.name for n in spares.spare_nodes(session, on)]
    return SparePool(cluster=on, target=body.target, members=members)


@router.get("/incidents")
def list_incidents(
    session: SessionDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100
) -> list[IncidentOut]:
    """Failures, what each touched, and how long recovery took, newest first."""
    rows = session.scalars(select(Incident).order_by(Incident.id.desc()).limit(limit)).all()
    return [incident_out(i) for i in rows]


def incident_out(incident: Incident) -> IncidentOut:
    out = IncidentOut.model_validate(incident)
    if incident.first_step_at is not None:
        out.recovery_s = (incident.first_step_at - incident.signal_at).total_seconds()
    return out


@router.post("/tokens", status_code=status.HTTP_201_CREATED)
def create_token(body: TokenCreate, session: SessionDep, principal: PrincipalDep) -> TokenCreated:
    """A new token for a user, an admin or an agent; the secret is in this answer only."""
    if body.role == Role.WORKER:
        raise InvalidSpec("role: worker tokens are minted by the service for each attempt")
    if (body.role == Role.AGENT) != (body.node_name is not None):
        raise InvalidSpec("node_name: give it for agent tokens, and only for them")
    if body.cluster is not None and body.node_name is None:
        raise InvalidSpec("cluster: give it for agent tokens (with node_name), and only for them")
    # The cluster by name (UnknownCluster, 422, names the known ones): an agent's node is
    # (cluster, name), its token bound to both.
    on = find_cluster(get_settings(), body.cluster).name if body.node_name else None
    expires = utcnow() + timedelta(days=body.expires_in_days) if body.expires_in_days else None
    row, secret = auth.create_token(
        session,
        user=body.user,
        team=body.team,
        role=body.role,
        node_name=body.node_name,
        node_cluster=on,
        expires_at=expires,
    )
    auth.audit(
        session,
        principal,
        "token.create",
        f"token {row.id}",
        {"user": body.user, "team": body.team, "role": body.role.value},
    )
    return TokenCreated.model_validate(
        {**TokenOut.model_validate(row).model_dump(), "token": secret}
    )


@router.get("/tokens")
def list_tokens(
    session: SessionDep, limit: Annotated[int, Query(ge=1, le=1000)] = 200
) -> list[TokenOut]:
    """Every user's tokens (never their secrets), newest first; worker tokens are left out."""
    return [TokenOut.model_validate(r) for r in auth.tokens_of(session, None, limit)]


@router.delete("/tokens/{token_id}")
def revoke_token(token_id: DbId, session: SessionDep, principal: PrincipalDep) -> TokenOut:
    """Revoke a token at once."""
    row = auth.revoke_token(session, token_id)
    auth.audit(session, principal, "token.revoke", f"token {token_id}", {"user": row.user})
    return TokenOut.model_validate(row)


@router.put("/teams/{team}")
def set_quota(team: str, body: TeamQuota, session: SessionDep, principal: PrincipalDep) -> TeamOut:
    """Set a team's GPU quota (None for unlimited)."""
    row = auth.ensure_team(session, team)
    before, row.gpu_quota = row.gpu_quota, body.gpu_quota
    auth.audit(session, principal, "team.quota", team, {"from": before, "to": body.gpu_quota})
    return TeamOut.model_validate(row)


@router.get("/audit")
def read_audit(
    session: SessionDep,
    after_id: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[AuditOut]:
    """The append-only audit log, oldest first."""
    return [AuditOut.model_validate(e) for e in auth.audit_entries(session, after_id, limit)]
