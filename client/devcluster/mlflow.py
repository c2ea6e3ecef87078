"""An MLflow tracking server for the dev cluster and the tests: `mlflow server` with a
Postgres backend store (its own database beside runyard's) and a local artifact folder.

It runs from its own virtual environment (scripts/bootstrap.sh makes .runyard/mlflow-venv):
the full `mlflow` package pins pyarrow and graphene versions that conflict with runyard's
own; runyard itself needs only MLflow's client. `runyard dev up --with mlflow` starts it
and points the service at it (RUNYARD_MLFLOW_TRACKING_URI).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from client.devcluster import postgres
from client.devcluster.paths import REPO_ROOT
from client.devcluster.processes import cmdline_of, group_members

MLFLOW_VENV = Path(os.environ.get("MLFLOW_VENV", REPO_ROOT / ".runyard" / "mlflow-venv"))
DEFAULT_PORT = 5000
START_TIMEOUT_S = 120.0  # its first start migrates the database (~30 s on 2 busy cores)


class MlflowUnavailable(RuntimeError):
    """The MLflow server could not be installed or started."""


def backend_store_uri(database_url: str, database: str) -> str:
    """The Postgres URL of MLflow's own database on runyard's server (psycopg 3 driver)."""
    url = make_url(database_url).set(drivername="postgresql+psycopg", database=database)
    return url.render_as_string(hide_password=False)


@dataclass
class MlflowServer:
    port: int
    store_uri: str
    artifacts: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start(self) -> None:
        """Start it (its own process group) and wait until it answers /health."""
        mlflow = MLFLOW_VENV / "bin" / "mlflow"
        if not mlflow.exists():
            raise MlflowUnavailable(f"{mlflow} is missing: run scripts/bootstrap.sh")
        postgres.ensure_database(self.store_uri)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        argv = [
            str(mlflow),
            "server",
            "--backend-store-uri",
            self.store_uri,
            "--artifacts-destination",
            str(self.artifacts),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise MlflowUnavailable(f"mlflow server did not start; see {self.log}")
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the server and its workers (the whole process group)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def dev_server(state_dir: Path, port: int = DEFAULT_PORT) -> MlflowServer:
    """The dev cluster's server: database runyard_mlflow on this machine's Postgres, where
    it always was (the dev cluster's own Postgres serves the service's role alone, and `dev
    up --with mlflow` starts MLflow before it), artifacts under the state folder."""
    return MlflowServer(
        port=port,
        store_uri=backend_store_uri(postgres.SYSTEM_SERVER_URL, "runyard_mlflow"),
        artifacts=state_dir / "mlflow-artifacts",
        log=state_dir / "log" / "mlflow.out",
    )


def pid_file(state_dir: Path) -> Path:
    return state_dir / "mlflow.pid"


def ensure_dev_server(runyard_database_url: str, state_dir: Path) -> MlflowServer:
    """The dev cluster's server, started unless it answers already; its URL is put in this
    process's environment, which the service `dev up` starts next inherits. MLflow's
    database no longer follows runyard's (`runyard_database_url`, which the CLI passes)."""
    postgres.ensure_running()
    server = dev_server(state_dir)
    server.log.parent.mkdir(parents=True, exist_ok=True)
    if not server.healthy():
        server.start()
        assert server.process is not None
        pid_file(state_dir).write_text(str(server.process.pid))
    os.environ["RUNYARD_MLFLOW_TRACKING_URI"] = server.url
    return server


def stop_dev_server(state_dir: Path) -> bool:
    """Stop the server `ensure_dev_server` started (its process group); False if none."""
    path = pid_file(state_dir)
    if not path.exists():
        return False
    pid = int(path.read_text().strip())
    path.unlink()
    # Its group, not `pid` alone: `mlflow server` supervises the uvicorn that serves, and
    # a killed supervisor leaves that serving in its group (issue 37).
    if not any("mlflow" in " ".join(cmdline_of(member)) for member in group_members(pid)):
        return False  # gone, or the PID was reused by something else
    os.killpg(pid, signal.SIGTERM)
    return True
