"""Errors render as {"error", "detail"}: a backend that does not answer is a 503 with a
stable code, wired in app.py so that errors.py depends on no backend."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.app import create_app
from service.slurm.commands import SlurmError


def test_slurm_not_answering_is_a_503_with_a_stable_code() -> None:
    app = create_app()

    @app.get("/probe-slurm")
    def probe() -> None:
        raise SlurmError("scontrol: error: Unable to contact slurm controller")

    response = TestClient(app).get("/probe-slurm")
    assert response.status_code == 503
    body = response.json()
    assert body["error"] == "slurm_unavailable"
    assert "Unable to contact slurm controller" in body["detail"]
    assert "check slurmctld" in body["detail"]
