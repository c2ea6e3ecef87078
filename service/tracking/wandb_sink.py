"""Weights & Biases: one W&B run per runyard run, id `runyard-<run id>`, resumed across
attempts and service restarts; offline by default (run folders under
<wandb_dir>/<team>/wandb/, for `wandb sync`; the team's folder 0750 and setgid, so what
wandb writes under it is no one else's: service/tracking/team_folders.py), online where the
site sets it.

Each step is a history row at its step; events are W&B alerts titled with their event id;
the end is the run's summary and exit code. What the run already holds is read back from
its folders (service/tracking/wandb_log.py) when the service starts exporting it again, so
a step is never logged twice: W&B would keep the first and warn about the second.
"""

from __future__ import annotations

import os
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from service.config import Settings
from service.tracking.records import FinalSummary, Held, StepRow, TrackedEvent, TrackedRun
from service.tracking.team_folders import team_folder
from service.tracking.wandb_log import read_run, run_files

EVENT_TITLE = re.compile(r"\[event (\d+)\]")
FINAL_KEY = "runyard/final_state"


def wandb_root(settings: Settings) -> Path:
    return settings.wandb_dir or settings.service_dir / "wandb"


def wait_for_a_new_folder_name(files: list[Path], run_id: str) -> None:
    """W&B names an offline run's folder `offline-run-<start second>-<id>`: a process that
    continues the run in the same second as the one before it (a restart right after an
    export began) would write into that process's folder, and the steps it had logged were
    lost (10 of 60 in a test). Waits, at most a second, until the name is a new one."""
    taken = {path.parent.name.removesuffix(f"-{run_id}").rsplit("-", 1)[-1] for path in files}
    while datetime.now().strftime("%Y%m%d_%H%M%S") in taken:
        time.sleep(0.05)


class WandbSink:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.root = wandb_root(settings)
        self._runs: dict[str, Any] = {}  # W&B run id -> the SDK's Run, open while exporting
        # The SDK's own settings, cache and staging files go beside the runs, not under the
        # service user's home (a system user may have none), unless the site set them.
        for variable, folder in (
            ("WANDB_CONFIG_DIR", "config"),
            ("WANDB_CACHE_DIR", "cache"),
            ("WANDB_DATA_DIR", "data"),
            ("WANDB_ARTIFACT_DIR", "artifacts"),
        ):
            os.environ.setdefault(variable, str(self.root / ".sdk" / folder))
        os.environ.setdefault("WANDB_SILENT", "true")

    def folder(self, run: TrackedRun) -> Path:
        return self.root / (run.team or "default")

    def open(self, run: TrackedRun, tracker_run_id: str | None) -> tuple[str, bool]:
        import wandb

        run_id = run.wandb_id
        if run_id in self._runs:
            return run_id, False
        folder = team_folder(self.root, run.team or "default")
        held = run_files(folder, run_id)
        created = not held
        wait_for_a_new_folder_name(held, run_id)
        self._runs[run_id] = wandb.init(
            project=run.wandb_project,
            entity=run.wandb_entity or self.settings.wandb_entity,
            id=run_id,
            name=run.name,
            dir=str(folder),
            mode=self.settings.wandb_mode,
            resume="allow",
            reinit="create_new",  # one SDK run per runyard run, side by side
            config=run.params if created else None,
            tags=[f"team:{run.team}"] if run.team else None,
            settings=wandb.Settings(
                console="off",  # the service's own output is not the run's
                save_code=False,
                x_disable_stats=True,  # the service host's CPU is not the run's
                x_disable_meta=True,
                silent=True,
            ),
        )
        return run_id, created

    def held(self, tracker_run_id: str, run: TrackedRun) -> Held:
        log = read_run(self.folder(run), tracker_run_id)
        steps = [step for step, row in log.history.items() if "loss" in row]
        events = {
            int(m.group(1)) for title, _ in log.alerts for m in [EVENT_TITLE.search(title)] if m
        }
        return Held(
            step=max(steps, default=0), event_ids=frozenset(events), final=FINAL_KEY in log.summary
        )

    def log(
        self,
        tracker_run_id: str,
        run: TrackedRun,
        rows: list[StepRow],
        events: list[TrackedEvent],
        through_step: int,
    ) -> None:
        from wandb.sdk.wandb_alerts import AlertLevel

        sdk_run = self._runs[tracker_run_id]
        for row in rows:
            sdk_run.log(dict(row.figures), step=row.step, commit=True)
        for event in events:
            level = (
                AlertLevel.WARN
                if "fail" in event.kind or "rolled" in event.kind
                else AlertLevel.INFO
            )
            sdk_run.alert(
                title=f"{event.kind} at step {event.step} [event {event.id}]",
                text=event.message,
                level=level,
                wait_duration=0,
            )

    def finish(self, tracker_run_id: str, run: TrackedRun, final: FinalSummary) -> None:
        sdk_run = self._runs.pop(tracker_run_id)
        sdk_run.summary.update({f"runyard/{key}": value for key, value in final.as_dict().items()})
        sdk_run.finish(exit_code=0 if final.state == "SUCCEEDED" else 1)

    def release(self, tracker_run_id: str) -> None:
        sdk_run = self._runs.pop(tracker_run_id, None)
        if sdk_run is not None:
            sdk_run.finish()
