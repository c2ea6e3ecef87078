"""Making the MUNGE credential `runyard login` posts: proof of who runs the CLI, from this
host's munged (which holds the cluster's key)."""

from __future__ import annotations

import subprocess

from contract.login import LOGIN_CREDENTIAL_TTL_S, LOGIN_PAYLOAD

MUNGE_TIMEOUT_S = 30


class CredentialError(Exception):
    """No credential could be made here; the message says why, for people."""


def login_credential() -> str:
    """A credential of the calling user's uid, for a runyard login, valid for a minute."""
    argv = ["munge", "-s", LOGIN_PAYLOAD, "-t", str(LOGIN_CREDENTIAL_TTL_S)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=MUNGE_TIMEOUT_S)
    except FileNotFoundError:
        raise CredentialError(
            "munge is not installed here: log in from a host of the cluster (a login node), "
            "where munged runs with the cluster's key"
        ) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CredentialError(f"munge did not make a credential ({exc})") from exc
    if done.returncode != 0:
        said = done.stderr.strip().removeprefix("munge: Error: ")
        raise CredentialError(
            f"munge could not make a credential ({said}); is munged running on this host?"
        )
    return done.stdout.strip()
