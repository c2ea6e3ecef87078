"""API tokens and `runyard login`: how long a token is trusted, and who may log in."""

from __future__ import annotations

from pydantic import Field

from service.config_areas.base import AreaSettings


class AuthSettings(AreaSettings):
    """API tokens and `runyard login`.

    How long an authenticated token is remembered and how soon a revocation applies; and
    `runyard login` (service/auth/login.py), where a person proves their uid with MUNGE:
    how long its tokens last, how fresh its credential must be, and which uids may."""

    auth_cache_ttl_s: float = Field(
        default=60.0,
        ge=0,
        description="How long an authenticated token is remembered (0: read api_tokens on "
        "every request). A revocation through this process applies at once; one through "
        "another process within auth_revocation_poll_s, and within this TTL at worst.",
    )
    auth_revocation_poll_s: float = Field(
        default=1.0, gt=0, description="How often each process reads the tokens revoked."
    )
    login_token_ttl_s: float = Field(
        default=43200.0,
        gt=0,
        description="How long a `runyard login` token lasts: 12 h, a working day, so one "
        "login in the morning serves the day (as a Kerberos ticket's default 10 h lifetime "
        "does), while a token left behind on a shared login host is dead by the next one. "
        "Tokens admins make for automation keep their own expiry.",
    )
    login_credential_max_age_s: float = Field(
        default=60.0,
        gt=0,
        description="A login's MUNGE credential encoded longer ago than this is refused, even "
        "when munged accepts it (its TTL may be up to munged's --max-ttl, an hour): each "
        "munged remembers the credentials it decoded only within their TTL and only on its "
        "own host, so a copied credential is worth this long at most. `runyard login` "
        "posts its credential within a second of making it; 60 s leaves room for a slow "
        "network and the clock skew between hosts that MUNGE itself tolerates.",
    )
    login_min_uid: int = Field(
        default=1000,
        ge=1,
        description="The lowest uid that may `runyard login`: root (0) never may, and system "
        "accounts (daemons, the service's own user, SlurmUser, munge) sit below 1000 on "
        "Debian and RHEL (UID_MIN). Logins must also be in owner_group.",
    )
