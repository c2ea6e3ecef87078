"""What the exporter hands a tracker, and what every tracker sink does with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

# Steps per send: MLflow takes at most 1,000 metric values per log_batch request (its
# documented limit), and a row carries up to 8 figures plus a batch's goodput figures; one
# request per batch keeps a batch all-or-nothing in the tracker.
MAX_STEPS_PER_BATCH = 100
MAX_EVENTS_PER_BATCH = 50  # MLflow: at most 100 tags per request


@dataclass(frozen=True)
class TrackedRun:
    """What opening the tracker's run needs: its names and the parameters logged once."""

    run_id: int
    name: str
    team: str
    owner: str
    mlflow_experiment: str | None
    wandb_project: str | None
    wandb_entity: str | None
    params: dict[str, str]

    @property
    def wandb_id(self) -> str:
        """W&B's run id: the same across attempts and service restarts (resume="allow")."""
        return f"runyard-{self.run_id}"

    @property
    def folder_name(self) -> str:
        return f"{self.run_id}-{self.name}"


@dataclass(frozen=True)
class StepRow:
    """One step of the run's surviving timeline: loss, tokens_per_s, step_time_s, lr, mfu,
    and where known val_loss, goodput and lost/<cause>_s."""

    step: int
    figures: dict[str, float]


@dataclass(frozen=True)
class TrackedEvent:
    """A recovery, rollback, preemption or segment boundary, at the step it happened."""

    id: int
    step: int
    kind: str
    message: str

    @property
    def text(self) -> str:
        return f"[event {self.id}] step {self.step}: {self.kind}: {self.message}"


@dataclass(frozen=True)
class FinalSummary:
    state: str
    reason: str
    last_step: int | None
    checkpoint_step: int | None
    checkpoint_path: str | None
    export_command: str | None

    def as_dict(self) -> dict[str, str]:
        values = {
            "final_state": self.state,
            "final_reason": self.reason,
            "final_step": self.last_step,
            "final_checkpoint_step": self.checkpoint_step,
            "final_checkpoint": self.checkpoint_path,
            "export_command": self.export_command,
        }
        return {key: str(value) for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class Held:
    """What a tracker already holds of a run, read back from the tracker itself."""

    step: int = 0  # every step up to it is there
    event_ids: frozenset[int] = field(default_factory=frozenset)
    final: bool = False  # the final state is there


class TrackerSink(Protocol):
    """One tracker. Calls may block on the tracker (they run on the exporter's thread, never
    in a request or the reconciler) and raise on any failure; the exporter retries later."""

    def open(self, run: TrackedRun, tracker_run_id: str | None) -> tuple[str, bool]:
        """The tracker's run for `run` (found again, or created with its parameters); its id,
        and whether it was created now (then it holds nothing yet)."""
        ...

    def held(self, tracker_run_id: str, run: TrackedRun) -> Held:
        """What the tracker holds of the run: the exporter's cursor after a restart or a
        send whose outcome is unknown."""
        ...

    def log(
        self,
        tracker_run_id: str,
        run: TrackedRun,
        rows: list[StepRow],
        events: list[TrackedEvent],
        through_step: int,
    ) -> None:
        """Send one batch; once it returns, held() counts it."""
        ...

    def finish(self, tracker_run_id: str, run: TrackedRun, final: FinalSummary) -> None:
        """The final state, the newest committed checkpoint and its export command; the
        tracker's run ends."""
        ...

    def release(self, tracker_run_id: str) -> None:
        """Forget what is kept open for the run (writers, SDK runs)."""
        ...
