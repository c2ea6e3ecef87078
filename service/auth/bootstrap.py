"""Mint a token straight into the database: how the first admin token (and the dev cluster's
agent tokens) come to exist before anyone can call the API.

    python -m service.auth.bootstrap --user admin --team ops --role admin --out admin.token \
        [--unix ana [--account ops]]
    python -m service.auth.bootstrap --from-json tokens.json   # many, in one process

The JSON form (a list of {"user", "team", "role", "node", "out", and optionally "unix" and
"account"}) is how `runyard dev up` mints the admin token, its users' tokens and one agent
token per node without importing the service. `unix` links the user to the Unix user their
runs run as (service/identity/), as `runyard admin user link` does once the API is up.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from service.auth.service import create_token
from service.auth.tokens import hash_token
from service.config import Settings
from service.identity.service import check_unix_user
from service.models import ApiToken, Role, TokenOrigin, UserLink


def token_file_is_valid(session: Session, path: Path, node_cluster: str | None = None) -> bool:
    """`path` holds a live token (for `node_cluster`'s node, where one is named: an agent
    token minted before its cluster was named is minted again)."""
    if not path.exists():
        return False
    row = session.scalars(
        select(ApiToken).where(ApiToken.token_hash == hash_token(path.read_text().strip()))
    ).one_or_none()
    if row is None or row.revoked_at is not None or row.expires_at is not None:
        return False
    return node_cluster is None or row.node_cluster == node_cluster


def mint_token_file(
    database_url: str,
    path: Path,
    *,
    user: str,
    team: str,
    role: Role,
    node_name: str | None = None,
    node_cluster: str | None = None,
) -> bool:
    """Write a new token to `path` (mode 0600) unless it already holds a valid one."""
    engine = create_engine(database_url)
    try:
        with Session(engine) as session, session.begin():
            if token_file_is_valid(session, path, node_cluster):
                return False
            _, secret = create_token(
                session,
                user=user,
                team=team,
                role=role,
                node_name=node_name,
                node_cluster=node_cluster,
                origin=TokenOrigin.BOOTSTRAP,
            )
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secret + "\n")
            return True
    finally:
        engine.dispose()


def link_unix_user(database_url: str, user: str, unix_user: str, account: str | None) -> None:
    """Link `user` to `unix_user` (and `account`), as `runyard admin user link` does."""
    check_unix_user(unix_user, Settings().owner_group)
    engine = create_engine(database_url)
    try:
        with Session(engine) as session, session.begin():
            link = session.get(UserLink, user) or UserLink(user=user, linked_by="bootstrap")
            link.unix_user, link.slurm_account = unix_user, account
            session.add(link)
    finally:
        engine.dispose()


def _mint_and_say(database_url: str, wanted: dict[str, str | None]) -> None:
    if wanted.get("unix"):
        link_unix_user(
            database_url, str(wanted["user"]), str(wanted["unix"]), wanted.get("account")
        )
        print(f"linked {wanted['user']} to Unix user {wanted['unix']}")
    out = Path(str(wanted["out"]))
    made = mint_token_file(
        database_url,
        out,
        user=str(wanted["user"]),
        team=str(wanted["team"]),
        role=Role(str(wanted["role"])),
        node_name=wanted.get("node"),
        node_cluster=wanted.get("cluster"),
    )
    print(f"{'wrote a new token to' if made else 'kept the valid token in'} {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--from-json", type=Path, help="a list of tokens to mint (see above)")
    parser.add_argument("--user")
    parser.add_argument("--team")
    parser.add_argument("--role", choices=[r.value for r in Role if r != Role.WORKER])
    parser.add_argument("--node", default=None, help="for agent tokens")
    parser.add_argument("--out", type=Path, help="file to write (mode 0600)")
    parser.add_argument("--unix", default=None, help="the Unix user the user's runs run as")
    parser.add_argument("--account", default=None, help="their Slurm account (default: team)")
    args = parser.parse_args()
    database_url = Settings().database_url
    if args.from_json is not None:
        for wanted in json.loads(args.from_json.read_text()):
            _mint_and_say(database_url, wanted)
        return
    if not (args.user and args.team and args.role and args.out):
        parser.error("give --from-json, or all of --user --team --role --out")
    _mint_and_say(
        database_url,
        {"user": args.user, "team": args.team, "role": args.role, "node": args.node,
         "out": str(args.out), "unix": args.unix, "account": args.account},
    )  # fmt: skip


if __name__ == "__main__":
    main()
