"""Which token a command sends, and where `runyard login` keeps the one it got.

In order: RUNYARD_TOKEN (automation, or a token an admin handed out), then the token of the
last `runyard login` ($XDG_CONFIG_HOME/runyard/token, else ~/.config/runyard/token), then
the local dev cluster's admin token. The saved token is a secret as good as its owner's
password until it expires: its folder is theirs alone (0700) and the file too (0600).
"""

from __future__ import annotations

import os
from enum import StrEnum
from pathlib import Path

from client.dev_state import default_state_dir


class TokenSource(StrEnum):
    """Where the token a command sends came from: what to tell its holder when it fails."""

    GIVEN = "given"  # handed to RunyardClient by the caller
    ENVIRONMENT = "environment"  # RUNYARD_TOKEN
    LOGIN = "login"  # the saved token of `runyard login`
    DEV_CLUSTER = "dev_cluster"  # the dev cluster's admin token
    NONE = "none"


def config_dir() -> Path:
    """The user's runyard configuration folder (XDG Base Directory)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "runyard"


def saved_token_path() -> Path:
    return config_dir() / "token"


def save_token(secret: str) -> Path:
    """Keep `secret` as the login token (0600, in a 0700 folder); replaces the last one.

    Written beside and renamed over, so a reader sees the old token or the new one, and the
    secret is never in a file anyone else could open, not even for a moment."""
    folder = config_dir()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.chmod(0o700)  # made earlier by something else, maybe readable by others
    path = saved_token_path()
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    draft.replace(path)
    return path


def saved_token() -> str | None:
    """The token of the last `runyard login`, if one is saved."""
    try:
        return saved_token_path().read_text().strip() or None
    except OSError:
        return None


def forget_token() -> bool:
    """Delete the saved token; whether there was one."""
    try:
        saved_token_path().unlink()
    except FileNotFoundError:
        return False
    return True


def dev_cluster_token() -> str | None:
    """The local dev cluster's admin token, when no other token is set."""
    path = default_state_dir() / "admin.token"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def resolve_token() -> tuple[str | None, TokenSource]:
    """The token a command sends when none is given, and where it came from."""
    for source, find in (
        (TokenSource.ENVIRONMENT, lambda: os.environ.get("RUNYARD_TOKEN") or None),
        (TokenSource.LOGIN, saved_token),
        (TokenSource.DEV_CLUSTER, dev_cluster_token),
    ):
        token = find()
        if token:
            return token, source
    return None, TokenSource.NONE
