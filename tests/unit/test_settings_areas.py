"""The settings are grouped by area (service/config_areas/), and `Settings` is all of them:
every setting sits in exactly one area, and each is still read from RUNYARD_<ITS NAME>,
whichever area holds it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.config import AREAS, Settings
from service.config_areas.base import AreaSettings

# One setting of each area, the text its variable is set to, and what Settings reads.
READ_FROM_ITS_VARIABLE = {
    "ServerSettings": ("port", "8443", 8443),
    "TlsSettings": ("tls_expiry_warn_days", "30", 30),
    "AuthSettings": ("login_min_uid", "2000", 2000),
    "IdentitySettings": ("owner_group", "ml-users", "ml-users"),
    "ClusterSettings": ("partition", "gpu-long", "gpu-long"),
    "ClustersSettings": (
        "clusters_file",
        "/etc/runyard/clusters.toml",
        Path("/etc/runyard/clusters.toml"),
    ),
    "ReconcilerSettings": ("reconcile_interval_s", "2.5", 2.5),
    "RecoverySettings": ("stop_grace_s", "90", 90.0),
    "NodeHealthSettings": ("slow_node_policy", "flag", "flag"),
    "ReplicaGroupSettings": ("lighthouse_ports", "29600-29699", "29600-29699"),
    "TrackingSettings": ("wandb_mode", "online", "online"),
    "NotificationSettings": ("notify_timeout_s", "3", 3.0),
    "ObservabilitySettings": ("log_format", "text", "text"),
}


def test_settings_is_its_areas_and_nothing_else() -> None:
    assert Settings.__bases__ == AREAS
    assert all(issubclass(area, AreaSettings) and area.__doc__ for area in AREAS)


def test_every_setting_belongs_to_exactly_one_area() -> None:
    # A field declared on Settings itself would be in no area, one declared twice in two.
    for name in Settings.model_fields:
        areas = [area.__name__ for area in AREAS if name in area.model_fields]
        assert len(areas) == 1, f"{name} is in {areas or 'no area'}"
    assert sum(len(area.model_fields) for area in AREAS) == len(Settings.model_fields)


def test_each_setting_is_read_from_runyard_and_its_name() -> None:
    # pydantic-settings reads a field from env_prefix + (alias or name): no alias anywhere.
    assert Settings.model_config.get("env_prefix") == "RUNYARD_"
    assert not Settings.model_config.get("case_sensitive")
    for area in AREAS:
        assert area.model_config.get("env_prefix") == "RUNYARD_", area.__name__
    aliased = [
        name
        for name, field in Settings.model_fields.items()
        if field.alias or field.validation_alias
    ]
    assert not aliased


@pytest.mark.parametrize("area", AREAS, ids=lambda area: area.__name__)
def test_an_areas_setting_is_read_from_its_variable(
    area: type[AreaSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, text, value = READ_FROM_ITS_VARIABLE[area.__name__]
    assert name in area.model_fields
    monkeypatch.setenv(f"RUNYARD_{name.upper()}", text)
    assert getattr(Settings(), name) == value
    assert getattr(area(), name) == value  # an area alone reads the same variable


@pytest.mark.parametrize("given", ["tls_cert_file", "tls_key_file"])
def test_a_tls_certificate_and_its_key_come_together(given: str, tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(**{given: tmp_path / "api.pem"})
    message = str(raised.value)
    assert "tls_cert_file and tls_key_file go together" in message
    assert f"{given} is set" in message


def test_tls_is_off_by_default_and_on_with_a_certificate_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Settings().tls_cert_file is None and Settings().tls_key_file is None
    monkeypatch.setenv("RUNYARD_TLS_CERT_FILE", str(tmp_path / "api.pem"))
    monkeypatch.setenv("RUNYARD_TLS_KEY_FILE", str(tmp_path / "api.key"))
    settings = Settings()
    assert (settings.tls_cert_file, settings.tls_key_file) == (
        tmp_path / "api.pem",
        tmp_path / "api.key",
    )
    assert settings.tls_client_ca_file is None and settings.tls_expiry_warn_days == 21
    with pytest.raises(ValidationError, match="tls_expiry_warn_days"):
        Settings(tls_expiry_warn_days=0)
