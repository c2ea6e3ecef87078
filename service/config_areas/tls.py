"""The API's HTTPS: its certificate, its key, and the clients' CA for mutual TLS."""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import Field, model_validator

from service.config_areas.base import AreaSettings


class TlsSettings(AreaSettings):
    """HTTPS (TLS).

    The certificate and key the API serves HTTPS with (service/serve.py), the CA the
    workers and agents verify it with, the CA whose client certificates it verifies
    (mutual TLS), and how early `runyard doctor` warns of the certificate's expiry.
    Without a certificate the API speaks plain HTTP, and only on a loopback address: it
    refuses to start on any other."""

    tls_cert_file: Path | None = Field(
        default=None,
        description="PEM certificate chain the API serves HTTPS with (None: plain HTTP, only "
        "allowed on loopback).",
    )
    tls_key_file: Path | None = Field(
        default=None,
        description="PEM private key of tls_cert_file, readable by the service alone.",
    )
    ca: Path | None = Field(
        default=None,
        description="PEM CA bundle that signed tls_cert_file, handed to every job as "
        "RUNYARD_CA: the workers verify the service with it (None: the system's store).",
    )
    tls_client_ca_file: Path | None = Field(
        default=None,
        description="Optional PEM CA bundle: clients presenting a certificate it signed are "
        "verified (mutual TLS).",
    )
    tls_expiry_warn_days: int = Field(
        default=21,
        ge=1,
        description="The doctor warns when the certificate expires within this many days.",
    )

    @model_validator(mode="after")
    def _cert_with_key(self) -> Self:
        # One without the other cannot serve HTTPS: refuse the start rather than fall back
        # to plain HTTP or fail at the first connection.
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            given, missing = (
                ("tls_cert_file", "tls_key_file")
                if self.tls_key_file is None
                else ("tls_key_file", "tls_cert_file")
            )
            raise ValueError(
                f"tls_cert_file and tls_key_file go together (both set: HTTPS; neither: plain "
                f"HTTP): {given} is set, {missing} is not"
            )
        return self
