"""The doctor's pure parts: the settings file as systemd reads it, Slurm's version string."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.doctor.result import SiteSettings, read_env_file
from client.doctor.slurm import parse_version


def test_env_file_reads_like_systemd(tmp_path: Path) -> None:
    path = tmp_path / "runyard.env"
    path.write_text(
        "# comment\n\nRUNYARD_PARTITION=gpu\nRUNYARD_DATABASE_URL='postgresql+psycopg://a@db/r'\n"
        'RUNYARD_PUBLIC_URL = "http://head:8000"\nnot a pair\n'
    )
    assert read_env_file(path) == {
        "RUNYARD_PARTITION": "gpu",
        "RUNYARD_DATABASE_URL": "postgresql+psycopg://a@db/r",
        "RUNYARD_PUBLIC_URL": "http://head:8000",
    }


def test_settings_file_is_overridden_by_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "runyard.env"
    path.write_text("RUNYARD_PARTITION=gpu\nRUNYARD_STATE_DIR=/shared/runyard\nRUNYARD_PORT=9000\n")
    for key in ("RUNYARD_URL", "RUNYARD_PUBLIC_URL", "RUNYARD_CHECKPOINT_ROOT", "RUNYARD_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RUNYARD_PARTITION", "train2")
    settings = SiteSettings.load(path)
    assert settings.partition == "train2"
    assert settings.checkpoint_root == Path("/shared/runyard/checkpoints")
    assert settings.service_url == "http://127.0.0.1:9000"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("slurm-wlm 22.05.8", (22, 5)), ("slurm 23.11.4", (23, 11)), ("nothing", None)],
)
def test_slurm_version_parsing(text: str, expected: tuple[int, int] | None) -> None:
    assert parse_version(text) == expected


def test_a_reservation_refused_for_permission_is_told_apart() -> None:
    from client.doctor.slurm import refused_for_permission

    assert refused_for_permission("Error creating the reservation: Invalid user id")
    assert refused_for_permission("Access/permission denied")
    assert not refused_for_permission("Error creating the reservation: Requested nodes are busy")
