"""What the token and login API sends and reads."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service.models import Role, TokenOrigin


class TokenOut(BaseModel):
    """A token as its owner and admins see it: never its secret."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    prefix: str
    user: str
    team: str
    role: Role
    origin: TokenOrigin = Field(
        description="How it was made: admin (automation), bootstrap, login, service."
    )
    node_name: str | None
    node_cluster: str | None = Field(
        default=None, description="An agent token's node's cluster (None: the default one)."
    )
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    created_at: datetime


class OwnTokenOut(TokenOut):
    current: bool = Field(description="The token this request was made with.")


class LoginRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    credential: str = Field(
        min_length=1,
        max_length=4096,
        description="A MUNGE credential with the payload `runyard-login`, made on a host of "
        "the cluster by the person logging in (`munge -s runyard-login -t 60`).",
    )


class CredentialCheckOut(BaseModel):
    """Whose a credential is, as the service's munged decoded it; no token is made."""

    uid: int = Field(description="The uid the credential proves (its maker's).")
    encode_host: str = Field(description="The host munged says encoded it.")
    login: str | None = Field(description="That uid's login on the service's host, if any.")
    can_log_in: bool = Field(description="Whether `runyard login` would give that uid a token.")
    detail: str = Field(description="Why it could not, or whom it would log in as.")


class LoginOut(BaseModel):
    token: str = Field(description="The secret: shown this once, stored only as a hash.")
    token_id: int
    user: str = Field(description="The runyard user the token is for.")
    team: str
    unix_user: str = Field(description="The login the user's runs run as.")
    slurm_account: str | None = Field(description="None: the team's account.")
    expires_at: datetime
    linked_now: bool = Field(description="This login linked the user to their login.")
