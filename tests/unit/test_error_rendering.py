"""Errors render as {"error", "detail"}: a backend that does not answer (Slurm, Postgres) is
a 503 with a stable code, wired in app.py so that errors.py depends on no backend."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

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


def test_a_database_that_does_not_answer_is_a_503_in_one_line() -> None:
    """A real driver error (nothing listens on the port): the client gets a 503 with a
    stable code and one line naming the cause, never an HTML 500 and a stack trace."""
    app = create_app()
    unreachable = create_engine("postgresql+psycopg://runyard@127.0.0.1:1/runyard")

    @app.get("/probe-database")
    def probe() -> None:
        with unreachable.connect() as conn:
            conn.execute(text("SELECT 1"))

    response = TestClient(app).get("/probe-database")
    assert response.status_code == 503
    body = response.json()
    assert body["error"] == "database_unavailable"
    assert "127.0.0.1" in body["detail"] and "check Postgres" in body["detail"]
    assert "\n" not in body["detail"], "the driver's background link stays out"
