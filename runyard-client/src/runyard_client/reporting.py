"""Where rank 0's reports go: the Reporter interface, its no-op base, and the JSON-lines file
of a standalone run. HttpReporter (http_reporter.py) sends them to the service.

One implementation for runyard's own trainer (worker/reporter.py re-exports these) and for
a team's script (Session), so both are seen alike by `run watch`, goodput and recovery.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Reporter:
    """The no-op reporter: standalone runs and ranks other than 0. Subclasses send."""

    cancel_requested: bool = False  # the service asked this run to stop
    # Steps between checkpoints as the service re-derives them from the cluster's failures
    # (service/runs/live_interval.py); None: keep the config's.
    checkpoint_every: int | None = None

    def metric(
        self,
        step: int,
        loss: float,
        tokens_per_s: float,
        step_time_s: float,
        lr: float | None = None,
    ) -> None:
        """Record one optimizer step and the learning rate it used (never blocks)."""

    def checkpoint(
        self,
        step: int,
        path: str,
        state: str,
        num_bytes: int = 0,
        write_s: float = 0.0,
        detail: str = "",
        stall_s: float | None = None,
    ) -> bool:
        """Register a checkpoint as WRITING or COMMITTED, or report it CORRUPT with `detail`
        (blocks, bounded). True once the service has it: only then may older checkpoints be
        pruned, because the service resumes from the newest commit *it* knows of. `stall_s`,
        with COMMITTED: what the save cost training in all, its blocking time plus its
        overlapped steps' excess (worker/checkpoint_cost.py)."""
        return True

    def finish(self, final_step: int, final_checkpoint_step: int) -> None:
        """Tell the service the run trained all its steps (blocks, bounded)."""

    def validation(self, step: int, loss: float) -> None:
        """Record the held-out loss at `step` (never blocks)."""

    def anomaly(self, step: int, kind: str, figure: str, message: str) -> None:
        """Report a non-finite or spiking loss or gradient norm at `step` (blocks, bounded):
        the attempt ends next, and the service rolls the run back past it."""

    def node_update_s(self, step: int, update_s: dict[str, float]) -> None:
        """Each node's slowest rank's mean update time over the window ending at `step`
        (worker/stragglers.py); sent with the next progress report (never blocks)."""

    def sdc_clean(self, step: int) -> None:
        """Data-parallel replicas' parameters matched after `step` (worker/sdc.py); sent
        with the next progress report (never blocks)."""

    def sdc(
        self,
        step: int,
        nodes: list[str],
        clean_step: int | None,
        message: str,
        outvoted: bool = False,
    ) -> None:
        """Replicas disagreed at `step`; `nodes` hold the odd ones out (blocks, bounded):
        the attempt ends next, the service drains them and rolls back to before
        `clean_step`, the last comparison that passed. `outvoted`: a strict majority of
        replica groups holds the right copy and trains on (only this group is replaced)."""

    def close(self, drain_timeout_s: float = 10.0) -> None:
        """Deliver what is buffered (for at most `drain_timeout_s`) and stop."""


class FileReporter(Reporter):
    """Appends every report as a JSON line: the standalone mode's record, and tests' oracle."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def _append(self, kind: str, **fields: Any) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")

    def metric(
        self,
        step: int,
        loss: float,
        tokens_per_s: float,
        step_time_s: float,
        lr: float | None = None,
    ) -> None:
        self._append(
            "metric",
            step=step,
            loss=loss,
            tokens_per_s=tokens_per_s,
            step_time_s=step_time_s,
            lr=lr,
        )

    def checkpoint(
        self,
        step: int,
        path: str,
        state: str,
        num_bytes: int = 0,
        write_s: float = 0.0,
        detail: str = "",
        stall_s: float | None = None,
    ) -> bool:
        self._append(
            "checkpoint",
            step=step,
            path=path,
            state=state,
            num_bytes=num_bytes,
            write_s=write_s,
            stall_s=stall_s,
        )
        return True

    def finish(self, final_step: int, final_checkpoint_step: int) -> None:
        self._append("finish", final_step=final_step, final_checkpoint_step=final_checkpoint_step)

    def validation(self, step: int, loss: float) -> None:
        self._append("validation", step=step, loss=loss)

    def anomaly(self, step: int, kind: str, figure: str, message: str) -> None:
        self._append("anomaly", step=step, anomaly=kind, figure=figure, message=message)

    def node_update_s(self, step: int, update_s: dict[str, float]) -> None:
        self._append("node_update_s", step=step, update_s=update_s)

    def sdc_clean(self, step: int) -> None:
        self._append("sdc_clean", step=step)

    def sdc(
        self,
        step: int,
        nodes: list[str],
        clean_step: int | None,
        message: str,
        outvoted: bool = False,
    ) -> None:
        self._append(
            "sdc", step=step, nodes=nodes, clean_step=clean_step, message=message, outvoted=outvoted
        )
