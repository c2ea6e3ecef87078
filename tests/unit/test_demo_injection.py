"""`make demo` injects its node failure whatever the machine's speed, and says so when it
could not: the demo's whole point is a run that survives one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from client.devcluster import demo
from client.devcluster.demo import DemoFailed, run_demo


class FastRun:
    """A run on a fast machine, as the service shows it: every 2 s report window holds a
    whole checkpoint interval, so each report lands on the step just committed (20, 40,
    ...), and the run succeeds after `reports` of them."""

    def __init__(self, reports: int, kern_log: Path) -> None:
        self.polls, self.reports, self.kern_log = 0, reports, kern_log

    def submit_run(self, spec: dict[str, Any]) -> dict[str, Any]:
        return {"id": 1}

    def step(self) -> int:
        return 20 * min(self.polls, self.reports)

    def get_run(self, run_id: int) -> dict[str, Any]:
        self.polls += 1
        done = self.polls > self.reports
        failed = "Xid" in self.kern_log.read_text()
        return {
            "state": "SUCCEEDED" if done else "RUNNING",
            "last_step": self.step(),
            "total_steps": 20 * self.reports,
            "last_loss": 2.5,
            "tokens_per_s": 20_000.0,
            "nodes": ["gpu002", "gpu003"],
            "attempts": [{"state": "RUNNING", "first_step": 1}] if not done else [],
            "num_restarts": int(failed),
        }

    def run_events(self, run_id: int, after: int) -> list[dict[str, Any]]:
        return []

    def run_checkpoints(self, run_id: int) -> list[dict[str, Any]]:
        return [{"step": s, "state": "COMMITTED"} for s in range(20, self.step() + 1, 20)]

    def get_spares(self) -> dict[str, Any]:
        return {"members": ["gpu001"], "target": 1}

    def set_spares(self, target: int) -> None:
        pass


class Clock:
    """time as the demo reads it: each of its half-second polls takes half a second."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def kern_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The failing node's kernel log, with the demo on a clock of its own."""
    monkeypatch.setattr(demo, "time", Clock())
    log = tmp_path / "kern.log"
    log.touch()
    return log


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    spec = tmp_path / "demo.yaml"
    spec.write_text(
        "name: tiny-demo\nnodes: 2\nsteps: 200\ncheckpoint_every: 20\n"
        "global_batch: 8\nseq_len: 128\n"
    )
    return spec


def test_the_failure_is_injected_when_reports_land_on_checkpoint_steps(
    kern_log: Path, spec_file: Path
) -> None:
    client = FastRun(reports=10, kern_log=kern_log)
    run = run_demo(client, Console(record=True), lambda node: kern_log, spec_file)  # type: ignore[arg-type]
    assert run["state"] == "SUCCEEDED"
    assert "Xid" in kern_log.read_text() and "79" in kern_log.read_text()


def test_a_run_that_ends_before_its_failure_fails_the_demo(kern_log: Path, spec_file: Path) -> None:
    client = FastRun(reports=0, kern_log=kern_log)  # done before its first commit
    with pytest.raises(DemoFailed, match="finished before its node failure"):
        run_demo(client, Console(record=True), lambda node: kern_log, spec_file)  # type: ignore[arg-type]
