"""/v1/auth and /v1/tokens: logging in with MUNGE, logging out, and one's own tokens.

An admin's view of every token is /v1/admin/tokens (service/admin/endpoints.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from service.auth import service as auth
from service.auth.deps import USERS, PrincipalDep
from service.auth.login import DefaultAccount, LoginRefused, log_in, login_of
from service.auth.munge import decode
from service.auth.schemas import (
    CredentialCheckOut,
    LoginOut,
    LoginRequest,
    OwnTokenOut,
    TokenOut,
)
from service.config import get_settings
from service.db import SessionDep
from service.errors import DbId, NotFound
from service.slurm.accounts import default_account

router = APIRouter(tags=["auth"])


def default_accounts() -> DefaultAccount:
    """Where a first login's Slurm account comes from: the site's accounting (sacctmgr)."""
    return default_account


DefaultAccountDep = Annotated[DefaultAccount, Depends(default_accounts)]


@router.post("/v1/auth/login")
def login(body: LoginRequest, session: SessionDep, accounts: DefaultAccountDep) -> LoginOut:
    """Trade a MUNGE credential for a user token that expires (no token needed)."""
    done = log_in(session, body.credential, get_settings(), accounts)
    return LoginOut(
        token=done.secret,
        token_id=done.token.id,
        user=done.link.user,
        team=done.token.team,
        unix_user=done.link.unix_user,
        slurm_account=done.link.slurm_account,
        expires_at=done.expires_at,
        linked_now=done.linked_now,
    )


@router.post("/v1/auth/check")
def check_credential(body: LoginRequest) -> CredentialCheckOut:
    """Decode a MUNGE credential and say whose it is and whether that uid may log in,
    without logging in: `runyard doctor`'s proof that a host shares the service's MUNGE
    key (a credential from a host with another key is refused: 401 credential_invalid)."""
    settings = get_settings()
    proof = decode(body.credential, settings.login_credential_max_age_s)
    login: str | None = None
    try:
        login = login_of(proof, settings)
        detail = f"uid {proof.uid} logs in as {login}"
    except LoginRefused as refused:
        detail = refused.detail
    return CredentialCheckOut(
        uid=proof.uid,
        encode_host=proof.encode_host,
        login=login,
        can_log_in=login is not None,
        detail=detail,
    )


@router.post("/v1/auth/logout", dependencies=[USERS])
def logout(session: SessionDep, principal: PrincipalDep) -> TokenOut:
    """Revoke the token this request is made with."""
    row = auth.revoke_token(session, principal.token_id)
    auth.audit(session, principal, "token.revoke", f"token {row.id}", {"user": row.user})
    return TokenOut.model_validate(row)


@router.get("/v1/tokens", dependencies=[USERS])
def own_tokens(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[OwnTokenOut]:
    """The caller's own tokens (never their secrets), newest first."""
    return [
        OwnTokenOut.model_validate(
            {**TokenOut.model_validate(row).model_dump(), "current": row.id == principal.token_id}
        )
        for row in auth.tokens_of(session, principal.user, limit)
    ]


@router.delete("/v1/tokens/{token_id}", dependencies=[USERS])
def revoke_own_token(token_id: DbId, session: SessionDep, principal: PrincipalDep) -> TokenOut:
    """Revoke one of the caller's tokens (an admin's: anyone's) at once."""
    row = auth.token(session, token_id)
    if row is None or not (principal.is_admin or auth.is_own(row, principal.user)):
        # Another's token does not exist, as far as a user can tell.
        raise NotFound(f"no token {token_id} of yours; `runyard token list` shows them")
    auth.revoke_token(session, token_id)
    auth.audit(session, principal, "token.revoke", f"token {token_id}", {"user": row.user})
    return TokenOut.model_validate(row)
