"""What a MUNGE credential proves: the uid of the process that made it, on a host that holds
the cluster's key, recently.

Every host of a Slurm cluster runs `munged` with the same key, and Slurm trusts a credential
as proof of a uid; `runyard login` does the same. The service decodes with `unmunge` (this
host's munged checks the key, the time to live and replays) and then checks what munged
leaves to the caller: how old the credential is (each munged keeps its own replay cache, so
a credential copied to another service replica's host would decode once more there) and
what it is for (its payload), so a credential made for something else cannot log anyone in.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from enum import StrEnum

from contract.login import LOGIN_PAYLOAD
from service.auth.principal import Unauthenticated
from service.errors import AppError

UNMUNGE_TIMEOUT_S = 10


class CredentialRefusal(StrEnum):
    """Why a credential proves nothing. The values are the API's error codes' tails."""

    MALFORMED = "malformed"  # not a MUNGE credential at all, or cut short
    INVALID = "invalid"  # made with another key (another cluster) or altered
    EXPIRED = "expired"  # past its own time to live
    REWOUND = "rewound"  # made in the future: the two hosts' clocks disagree
    REPLAYED = "replayed"  # decoded here before: a copy
    UNAUTHORIZED = "unauthorized"  # restricted to another decoder's uid or gid
    TOO_OLD = "too_old"  # older than the site allows a login's credential to be
    NOT_FOR_LOGIN = "not_for_login"  # its payload is not runyard login's


# unmunge exits with MUNGE's munge_err_t (munge/src/libmunge/munge.h, 0.5.x).
REFUSALS = {
    2: CredentialRefusal.MALFORMED,  # EMUNGE_BAD_ARG
    3: CredentialRefusal.MALFORMED,  # EMUNGE_BAD_LENGTH
    8: CredentialRefusal.MALFORMED,  # EMUNGE_BAD_CRED
    9: CredentialRefusal.MALFORMED,  # EMUNGE_BAD_VERSION
    10: CredentialRefusal.MALFORMED,  # EMUNGE_BAD_CIPHER
    11: CredentialRefusal.MALFORMED,  # EMUNGE_BAD_MAC
    12: CredentialRefusal.MALFORMED,  # EMUNGE_BAD_ZIP
    13: CredentialRefusal.MALFORMED,  # EMUNGE_BAD_REALM
    14: CredentialRefusal.INVALID,  # EMUNGE_CRED_INVALID
    15: CredentialRefusal.EXPIRED,  # EMUNGE_CRED_EXPIRED
    16: CredentialRefusal.REWOUND,  # EMUNGE_CRED_REWOUND
    17: CredentialRefusal.REPLAYED,  # EMUNGE_CRED_REPLAYED
    18: CredentialRefusal.UNAUTHORIZED,  # EMUNGE_CRED_UNAUTHORIZED
}
# What each refusal tells the person logging in.
ADVICE = {
    CredentialRefusal.MALFORMED: "this is not a MUNGE credential; `runyard login` makes one",
    CredentialRefusal.INVALID: "the credential was not made with this cluster's MUNGE key "
    "(another cluster's host, or altered): log in from a host of this cluster",
    CredentialRefusal.EXPIRED: "the credential outlived its time to live before it reached the "
    "service; run `runyard login` again",
    CredentialRefusal.REWOUND: "the credential was made in the future: the clocks of your host "
    "and the service's disagree (check NTP), then run `runyard login` again",
    CredentialRefusal.REPLAYED: "this credential was used before; each login needs a new one "
    "(`runyard login` makes it)",
    CredentialRefusal.UNAUTHORIZED: "the credential may be decoded only by another user or "
    "group (munge -u/-g), not by the service",
    CredentialRefusal.NOT_FOR_LOGIN: "the credential was not made for a runyard login; "
    "`runyard login` makes one",
}


class CredentialRefused(Unauthenticated):
    """A credential that proves no one: 401, with a code per reason (`credential_replayed`)."""

    def __init__(self, reason: CredentialRefusal, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.code = f"credential_{reason.value}"


class MungeUnavailable(AppError):
    """The service host's munged did not answer: the site's to fix, not the caller's."""

    status_code = 503
    code = "munge_unavailable"


@dataclass(frozen=True)
class MungeProof:
    """What a decoded credential says: who made it, where and when."""

    uid: int
    gid: int
    encode_host: str
    encoded_at: float  # seconds since the epoch, the encoding host's clock
    ttl_s: int
    payload: bytes


def decode(credential: str, max_age_s: float) -> MungeProof:
    """The proof in a login's `credential`, or CredentialRefused saying why there is none.

    Runs `unmunge` (a local socket to munged, no network): call it before the request's
    database transaction begins."""
    try:
        done = subprocess.run(
            ["unmunge"],
            input=credential.encode(),
            capture_output=True,
            timeout=UNMUNGE_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MungeUnavailable(f"cannot run unmunge on the service's host: {exc}") from exc
    reason = REFUSALS.get(done.returncode)
    # Why, in MUNGE's words: its error line, or else (a credential it could read) the status.
    said = done.stderr.decode(errors="replace").strip().removeprefix("unmunge: Error: ")
    said = said or read_fields(done.stdout).get("STATUS", f"status {done.returncode}")
    if reason is not None:
        raise CredentialRefused(reason, f"MUNGE refused the credential ({said}): {ADVICE[reason]}")
    if done.returncode != 0:  # munged not running, out of memory, its socket refused
        raise MungeUnavailable(
            f"the service's munged could not decode the credential ({said}); the site's "
            "admins check munged on the service's host (docs/install.md)"
        )
    proof = parse_unmunge(done.stdout)
    check_proof(proof, max_age_s, time.time())
    return proof


def read_fields(out: bytes) -> dict[str, str]:
    """unmunge's metadata: `KEY: value` lines up to the first empty line."""
    head = out.partition(b"\n\n")[0].decode(errors="replace")
    fields = {}
    for line in head.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def number_of(value: str) -> str:
    """`alice (1001)` -> `1001`; `300` -> `300` (unmunge names what it can, numbers after)."""
    return value.rpartition("(")[2].rstrip(")") if value.endswith(")") else value


def parse_unmunge(out: bytes) -> MungeProof:
    """unmunge's output: `KEY: value` lines (`UID: alice (1001)`, `ENCODE_TIME: 2026-12-06
    08:24:26 +0000 (1796545466)`), an empty line, then the payload."""
    fields = read_fields(out)
    try:
        return MungeProof(
            uid=int(number_of(fields["UID"])),
            gid=int(number_of(fields["GID"])),
            encode_host=fields.get("ENCODE_HOST", ""),
            encoded_at=float(number_of(fields["ENCODE_TIME"])),
            ttl_s=int(number_of(fields["TTL"])),
            payload=out.partition(b"\n\n")[2],
        )
    except (KeyError, ValueError) as exc:
        raise MungeUnavailable(f"unmunge printed what the service cannot read ({exc})") from exc


def check_proof(proof: MungeProof, max_age_s: float, now: float) -> None:
    """What munged leaves to us: the credential is a login's, and recent."""
    if proof.payload != LOGIN_PAYLOAD.encode():
        reason = CredentialRefusal.NOT_FOR_LOGIN
        raise CredentialRefused(reason, f"MUNGE accepted the credential, but {ADVICE[reason]}")
    age_s = now - proof.encoded_at
    if age_s < -max_age_s:  # munged takes a skew within the TTL; a login's window is shorter
        reason = CredentialRefusal.REWOUND
        raise CredentialRefused(
            reason, f"{ADVICE[reason]} ({-age_s:.0f} s ahead, on {proof.encode_host})"
        )
    if age_s > max_age_s:
        raise CredentialRefused(
            CredentialRefusal.TOO_OLD,
            f"the credential was made {age_s:.0f} s ago on {proof.encode_host}; this site "
            f"takes a login's credential for {max_age_s:.0f} s at most "
            "(RUNYARD_LOGIN_CREDENTIAL_MAX_AGE_S): run `runyard login` again",
        )
