"""/v1/admin/users: who each runyard user runs as. Admin tokens only; audited."""

from __future__ import annotations

import os
import pwd

from fastapi import APIRouter

from service.auth import service as auth
from service.auth.deps import ADMINS, PrincipalDep
from service.config import get_settings
from service.db import SessionDep
from service.identity import service
from service.identity.gate import fault_hooks
from service.identity.schemas import ServiceIdentity, UserLinkOut, UserLinkRequest

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[ADMINS])


@router.put("/users/{user}/link")
def link_user(
    user: str, body: UserLinkRequest, session: SessionDep, principal: PrincipalDep
) -> UserLinkOut:
    """Link a user to the Unix user (and Slurm account) their runs run as."""
    service.check_name("user", user)
    link = service.link_user(session, user, body.unix_user, body.slurm_account, principal)
    detail = {"unix_user": body.unix_user, "slurm_account": body.slurm_account}
    auth.audit(session, principal, "user.link", user, detail)
    return UserLinkOut.model_validate(link)


@router.delete("/users/{user}/link")
def unlink_user(user: str, session: SessionDep, principal: PrincipalDep) -> dict[str, str]:
    """Remove a user's link: they cannot submit until linked again (runs keep theirs)."""
    service.unlink_user(session, user)
    auth.audit(session, principal, "user.unlink", user, {})
    return {"user": user}


@router.get("/users")
def users(session: SessionDep) -> list[UserLinkOut]:
    """Every linked user."""
    return [UserLinkOut.model_validate(link) for link in service.list_links(session)]


@router.get("/service-identity")
def service_identity() -> ServiceIdentity:
    """The Unix user this service process runs as, and the test hooks set in its environment."""
    uid = os.geteuid()
    return ServiceIdentity(
        unix_user=pwd.getpwuid(uid).pw_name,
        uid=uid,
        is_root=uid == 0,
        environment=get_settings().environment,
        fault_hooks=sorted(fault_hooks()),
    )
