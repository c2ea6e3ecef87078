"""The authenticated caller and the checks every endpoint makes on it."""

from __future__ import annotations

from dataclasses import dataclass

from service.errors import AppError, NotFound
from service.models import Role


class Unauthenticated(AppError):
    status_code = 401
    code = "unauthenticated"


class TokenExpired(Unauthenticated):
    """A token past its `expires_at`: a login's says to log in again (the CLI reads the
    code and says so in one line), an admin-made one's to ask an admin."""

    code = "token_expired"


class Forbidden(AppError):
    status_code = 403
    code = "forbidden"


@dataclass(frozen=True)
class Principal:
    token_id: int
    user: str
    team: str
    role: Role
    node_name: str | None = None
    node_cluster: str | None = None  # an agent's node's cluster; None: the default one
    run_id: int | None = None
    attempt_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == Role.ADMIN

    def require(self, *roles: Role) -> None:
        if self.role not in roles:
            allowed = " or ".join(r.value for r in roles)
            raise Forbidden(f"this needs a {allowed} token; yours is a {self.role.value} token")

    def require_node(self, cluster: str, name: str, default_cluster: str) -> None:
        """Agents speak only for their own node of their own cluster (admins for any): node
        names repeat across clusters. A token that names no cluster is the default one's."""
        if self.role != Role.AGENT:
            return
        own = self.node_cluster or default_cluster
        if (own, self.node_name) != (cluster, name):
            raise Forbidden(
                f"this agent token belongs to node {self.node_name} of cluster {own}, "
                f"not {name} of {cluster}"
            )

    def require_attempt(self, attempt_id: int) -> None:
        """Worker tokens are scoped to one attempt (admins may act for any)."""
        if self.role == Role.WORKER and self.attempt_id != attempt_id:
            raise Forbidden(f"this worker token belongs to attempt {self.attempt_id}")

    def require_team_of(self, team: str, what: str) -> None:
        """Another team's object does not exist, as far as a user can tell."""
        if not self.is_admin and team != self.team:
            raise NotFound(what)
