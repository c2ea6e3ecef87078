"""The dev cluster's own certificate authority, so it serves HTTPS as a site does.

`runyard dev up` makes a CA and a server certificate for this host (127.0.0.1, ::1,
localhost and the host's name) in STATE/tls/: the service serves with the certificate,
and the CLI, the agents, the workers and the tests verify it against the CA through
RUNYARD_CA (env.sh exports it), exactly as they verify a site's certificate. The CA's key
signs one server certificate and is kept 0600 beside it; the server key belongs to the
service's user alone (0600), as a site's would.

ECDSA P-256: what browsers and Let's Encrypt issue by default today, and it is made in
milliseconds (an RSA key takes a noticeable part of a second on these machines). A
certificate is made again when it expires within RENEW_WITHIN, or names other hosts.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import pwd
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = dt.timedelta(days=365)
SERVER_LIFETIME = dt.timedelta(days=90)  # what public CAs issue; dev up renews it
RENEW_WITHIN = dt.timedelta(days=21)


@dataclass(frozen=True)
class DevTls:
    """The files of the dev cluster's TLS, under STATE/tls/."""

    folder: Path

    @property
    def ca_cert(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.folder / "ca-key.pem"

    @property
    def server_cert(self) -> Path:
        return self.folder / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.folder / "server-key.pem"

    def service_settings(self) -> dict[str, str]:
        """A service's settings to serve HTTPS with these files, and the CA it hands its
        jobs (RUNYARD_CA): the dev cluster's services and the tests' alike."""
        return {
            "RUNYARD_TLS_CERT_FILE": str(self.server_cert),
            "RUNYARD_TLS_KEY_FILE": str(self.server_key),
            "RUNYARD_CA": str(self.ca_cert),
        }


def server_names(extra: tuple[str, ...] = ()) -> list[str]:
    """The host names the server certificate must hold: loopback, this host's names (a
    site's public URL names `hostname -f`, docs/install.md step 3) and `extra` (the compose
    cluster's `service`)."""
    names = {"localhost", socket.gethostname(), socket.getfqdn(), *extra}
    try:
        done = subprocess.run(["hostname", "-f"], capture_output=True, text=True, timeout=10)
        names |= set(done.stdout.split()) if done.returncode == 0 else set()
    except (OSError, subprocess.TimeoutExpired):
        pass
    return sorted(n for n in names if n)


def server_addresses() -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _still_good(cert_file: Path, names: list[str] | None = None) -> bool:
    """Whether `cert_file` exists, is valid past RENEW_WITHIN and names every one of
    `names` (when given)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    except (OSError, ValueError):
        return False
    if cert.not_valid_after_utc - _now() < RENEW_WITHIN:
        return False
    if names is None:
        return True
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return set(names) <= set(san.get_values_for_type(x509.DNSName))


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey, owner: str | None) -> None:
    """The key in PEM, created 0600 (never readable by others, not even for a moment)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    if owner is not None and os.geteuid() == 0:
        entry = pwd.getpwnam(owner)
        os.chown(path, entry.pw_uid, entry.pw_gid)


def _make_ca(tls: DevTls) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "runyard dev cluster CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    _write_key(tls.ca_key, key, owner=None)
    tls.ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.ca_cert.chmod(0o644)  # a certificate is public: every user's script verifies with it
    return cert, key


def _load_ca(tls: DevTls) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(tls.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(tls.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{tls.ca_key} is not the dev CA's ECDSA key")
    return cert, key


def _make_server(
    tls: DevTls,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    service_user: str | None,
    names: list[str],
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    alt_names += [x509.IPAddress(a) for a in server_addresses()]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "runyard service")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + SERVER_LIFETIME, ca.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(tls.server_key, key, owner=service_user)
    tls.server_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.server_cert.chmod(0o644)


def ensure(
    folder: Path, service_user: str | None = None, extra_names: tuple[str, ...] = ()
) -> DevTls:
    """The dev CA and the server certificate in `folder`, made or renewed where needed;
    the server key owned by `service_user` (when running as root)."""
    names = server_names(extra_names)
    tls = DevTls(folder)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)  # the CA and the certificate are read by every user's processes
    if _still_good(tls.ca_cert) and tls.ca_key.exists():
        ca, ca_key = _load_ca(tls)
    else:
        ca, ca_key = _make_ca(tls)
        tls.server_cert.unlink(missing_ok=True)  # signed by the old CA
    if not (_still_good(tls.server_cert, names) and tls.server_key.exists()):
        _make_server(tls, ca, ca_key, service_user, names)
    return tls


def main(argv: list[str] | None = None) -> None:
    """`python -m client.devcluster.tls FOLDER [--name HOST]...`: the compose cluster's
    service container makes its CA and certificate in the shared state volume."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--name", action="append", default=[], help="another DNS name")
    args = parser.parse_args(argv)
    made = ensure(args.folder, extra_names=tuple(args.name))
    print(made.ca_cert)


if __name__ == "__main__":
    main()
