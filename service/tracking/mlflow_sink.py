"""MLflow: one MLflow run per runyard run, in the spec's experiment, on the site's server.

Each batch is one `log_batch` request whose metrics include `runyard.exported_step` at the
batch's last step: the server stores a request's metrics in one transaction, so that
metric's latest value is exactly how far the tracker got, whatever happened to the
service mid-request. Events are tags keyed by their id (`runyard.event.000123`): sent again,
a tag is overwritten, never doubled. The run is found again by its `runyard.run_id` tag.
"""

from __future__ import annotations

import os
import time
from typing import Any

from service.config import Settings
from service.tracking.records import FinalSummary, Held, StepRow, TrackedEvent, TrackedRun

EXPORTED_STEP = "runyard.exported_step"
EVENT_TAG = "runyard.event."
RUN_ID_TAG = "runyard.run_id"
FINAL_TAG = "runyard.final_state"
MAX_PARAMS_PER_REQUEST = 100  # MLflow's log_batch limit
MAX_TAG_CHARS = 5000  # MLflow's limit on a tag's value (8,000 on recent servers)
STATUS_OF_STATE = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED", "CANCELLED": "KILLED"}


class MlflowSink:
    def __init__(self, settings: Settings) -> None:
        if not settings.mlflow_tracking_uri:
            raise RuntimeError("RUNYARD_MLFLOW_TRACKING_URI is unset: no MLflow server to log to")
        # MLflow's client retries a failed request for minutes by default; the exporter
        # retries on its own schedule, so one try per request, bounded in time.
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(
            max(1, int(settings.mlflow_request_timeout_s))
        )
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=settings.mlflow_tracking_uri)

    def _experiment_id(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is not None:
            return str(experiment.experiment_id)
        try:
            return str(self.client.create_experiment(name))
        except MlflowException:  # created meanwhile by someone else
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return str(found.experiment_id)

    def open(self, run: TrackedRun, tracker_run_id: str | None) -> tuple[str, bool]:
        from mlflow.entities import Param

        if tracker_run_id is not None:
            return tracker_run_id, False
        experiment_id = self._experiment_id(run.mlflow_experiment or "runyard")
        # Created before the service could record its id (killed in between): found again.
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run.run_id}'", max_results=1
        )
        if found:
            return str(found[0].info.run_id), False
        created = self.client.create_run(
            experiment_id,
            run_name=run.name,
            tags={
                RUN_ID_TAG: str(run.run_id),
                "runyard.team": run.team,
                "runyard.owner": run.owner,
            },
        )
        run_uuid = str(created.info.run_id)
        params = [Param(key, value) for key, value in sorted(run.params.items())]
        for first in range(0, len(params), MAX_PARAMS_PER_REQUEST):
            chunk = params[first : first + MAX_PARAMS_PER_REQUEST]
            self.client.log_batch(run_uuid, params=chunk)
        return run_uuid, True

    def held(self, tracker_run_id: str, run: TrackedRun) -> Held:
        data = self.client.get_run(tracker_run_id).data
        tags: dict[str, str] = data.tags
        return Held(
            step=int(data.metrics.get(EXPORTED_STEP, 0)),
            event_ids=frozenset(int(k[len(EVENT_TAG) :]) for k in tags if k.startswith(EVENT_TAG)),
            final=FINAL_TAG in tags,
        )

    def log(
        self,
        tracker_run_id: str,
        run: TrackedRun,
        rows: list[StepRow],
        events: list[TrackedEvent],
        through_step: int,
    ) -> None:
        from mlflow.entities import Metric, RunTag

        now_ms = int(time.time() * 1000)
        metrics = [
            Metric(key, value, now_ms, row.step)
            for row in rows
            for key, value in row.figures.items()
        ]
        metrics.append(Metric(EXPORTED_STEP, float(through_step), now_ms, through_step))
        tags = [RunTag(f"{EVENT_TAG}{e.id:06d}", e.text[:MAX_TAG_CHARS]) for e in events]
        if events:
            tags.append(RunTag("runyard.last_event", events[-1].text[:MAX_TAG_CHARS]))
        self.client.log_batch(tracker_run_id, metrics=metrics, tags=tags)

    def finish(self, tracker_run_id: str, run: TrackedRun, final: FinalSummary) -> None:
        from mlflow.entities import RunTag

        tags = [
            RunTag(f"runyard.{key}", value[:MAX_TAG_CHARS])
            for key, value in final.as_dict().items()
        ]
        self.client.log_batch(tracker_run_id, tags=tags)
        status: Any = STATUS_OF_STATE.get(final.state, "FINISHED")
        self.client.set_terminated(tracker_run_id, status=status)

    def release(self, tracker_run_id: str) -> None:
        """Nothing is kept open: every call is a request."""
