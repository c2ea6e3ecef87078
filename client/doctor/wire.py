"""The doctor's checks of what crosses the wire: the service's TLS and the cluster's MUNGE.

TLS: plain HTTP is off (a certificate is set, or the service listens on loopback only),
the certificate is readable, matches its key, is valid and not near its expiry, and the
service answers over HTTPS verified as every client verifies it (RUNYARD_CA or the system
store). MUNGE: this host's munged makes a credential, and the service decodes it
(POST /v1/auth/check) as a credential of this very uid: a host with another key, or a
munged that is down, would refuse every `runyard login` made here.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from runyard_client.tls import is_loopback, is_loopback_host

from client.api import ApiError, RunyardClient
from client.doctor.result import Area, Check, SiteSettings, Status, failed, passed, skipped
from client.munge import CredentialError, login_credential

DEFAULT_WARN_DAYS = 21


def plain_http(settings: SiteSettings) -> Check:
    values = settings.extra
    host = values.get("RUNYARD_HOST", "127.0.0.1")
    if values.get("RUNYARD_TLS_CERT_FILE"):
        return passed(Area.WIRE, "plain HTTP off", f"HTTPS on {host}")
    if is_loopback_host(host):
        return passed(Area.WIRE, "plain HTTP off", f"plain HTTP on loopback ({host}) only")
    return failed(
        Area.WIRE,
        "plain HTTP off",
        f"RUNYARD_HOST={host} with no RUNYARD_TLS_CERT_FILE: tokens would cross the network "
        "in clear (the service refuses to start so)",
        "set RUNYARD_TLS_CERT_FILE and RUNYARD_TLS_KEY_FILE (docs/install.md step 3, TLS)",
    )


def _days_left(cert: x509.Certificate) -> float:
    return (cert.not_valid_after_utc - dt.datetime.now(dt.UTC)).total_seconds() / 86400


def _same_key(cert: x509.Certificate, key_file: Path) -> bool:
    key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    pem = serialization.Encoding.PEM
    return bool(
        key.public_key().public_bytes(pem, spki) == cert.public_key().public_bytes(pem, spki)
    )


def certificate(settings: SiteSettings) -> Check:
    """The certificate file: readable, matching its key, valid and not near its expiry."""
    values = settings.extra
    cert_file = values.get("RUNYARD_TLS_CERT_FILE")
    if not cert_file:
        return skipped(Area.WIRE, "certificate", "no RUNYARD_TLS_CERT_FILE: plain HTTP")
    warn_days = float(values.get("RUNYARD_TLS_EXPIRY_WARN_DAYS", DEFAULT_WARN_DAYS))
    try:
        cert = x509.load_pem_x509_certificate(Path(cert_file).read_bytes())
        matches = _same_key(cert, Path(values.get("RUNYARD_TLS_KEY_FILE", "")))
    except (OSError, ValueError, TypeError) as exc:
        return failed(
            Area.WIRE,
            "certificate",
            f"cannot read {cert_file} or its key ({exc.__class__.__name__}: {exc})",
            "run the doctor as root or the service's user; RUNYARD_TLS_CERT_FILE and "
            "RUNYARD_TLS_KEY_FILE name a PEM chain and its unencrypted key",
        )
    left = _days_left(cert)
    subject = cert.subject.rfc4514_string()
    until = cert.not_valid_after_utc.strftime("%Y-%m-%d")
    if not matches:
        return failed(
            Area.WIRE,
            "certificate",
            f"{cert_file} ({subject}) does not match RUNYARD_TLS_KEY_FILE",
            "install the key that belongs to the certificate",
        )
    if left <= 0:
        return failed(
            Area.WIRE, "certificate", f"{subject} expired on {until}", "renew the certificate"
        )
    if left < warn_days:
        return Check(
            Area.WIRE,
            "certificate",
            Status.WARN,
            f"{subject} expires on {until}, in {left:.0f} days",
            f"renew it before then (warned {warn_days:.0f} days ahead: "
            "RUNYARD_TLS_EXPIRY_WARN_DAYS)",
        )
    return passed(Area.WIRE, "certificate", f"{subject}, valid until {until} ({left:.0f} days)")


def verified(settings: SiteSettings, client: RunyardClient) -> Check:
    """The service answers over the URL its clients use, its certificate verified."""
    url = settings.service_url
    if not url.startswith("https://") and not is_loopback(url):
        return failed(
            Area.WIRE,
            "HTTPS verified",
            f"{url} is plain HTTP to another host: no client sends a token there",
            "make RUNYARD_PUBLIC_URL an https:// URL the certificate names",
        )
    try:
        client.health()
    except ApiError as exc:
        return failed(
            Area.WIRE,
            "HTTPS verified",
            exc.message,
            "RUNYARD_CA names the CA that signed RUNYARD_TLS_CERT_FILE, whose names include "
            "the host in RUNYARD_PUBLIC_URL",
        )
    how = "verified" if url.startswith("https://") else "plain HTTP on loopback"
    return passed(Area.WIRE, "HTTPS verified", f"{url} answers ({how})")


def munge(client: RunyardClient) -> list[Check]:
    """munged here makes a credential, and the service's munged decodes it as ours."""
    try:
        credential = login_credential()
    except CredentialError as exc:
        return [
            failed(Area.WIRE, "MUNGE here", str(exc), "start munged with the cluster's key"),
            skipped(Area.WIRE, "MUNGE key shared", "no credential to send"),
        ]
    here = passed(Area.WIRE, "MUNGE here", "munged made a credential of this uid")
    try:
        answer = client.check_credential(credential)
    except ApiError as exc:
        return [
            here,
            failed(
                Area.WIRE,
                "MUNGE key shared",
                f"the service refused this host's credential: {exc.message}",
                "copy the cluster's /etc/munge/munge.key to this host (mode 0400, owner "
                "munge) and restart munged",
            ),
        ]
    if answer["uid"] != os.getuid():
        return [
            here,
            failed(
                Area.WIRE,
                "MUNGE key shared",
                f"the service read uid {answer['uid']}, this process is uid {os.getuid()}",
                "give every host the same uids (the site's directory service)",
            ),
        ]
    return [
        here,
        passed(
            Area.WIRE,
            "MUNGE key shared",
            f"the service decoded our credential (uid {answer['uid']}): {answer['detail']}",
        ),
    ]


def check_wire(settings: SiteSettings, client: RunyardClient | None = None) -> list[Check]:
    client = client or settings.client()
    checks = [plain_http(settings), certificate(settings), verified(settings, client)]
    if checks[-1].status is Status.FAIL:
        return [*checks, skipped(Area.WIRE, "MUNGE key shared", "the service is not reached")]
    return checks + munge(client)
