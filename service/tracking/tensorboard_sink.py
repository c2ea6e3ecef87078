"""TensorBoard: event files under <tensorboard_root>/<team>/<run id>-<name>/, written with
TensorBoard's own event-file writer and protos (no TensorFlow, no torch); folders 0750 and
files 0640 (service/tracking/team_folders.py).

Each figure is a scalar at its step; events and the end are text entries (TensorBoard's
text plugin) tagged `runyard/events` and `runyard/final`. A service restart writes a new
event file in the same folder, which TensorBoard reads as one run. What the folder already
holds is read back with TensorBoard's EventAccumulator when the service starts exporting
the run again, so no step is written twice.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from service.config import Settings
from service.tracking.records import FinalSummary, Held, StepRow, TrackedEvent, TrackedRun
from service.tracking.team_folders import private_files, team_folder

EVENTS_TAG = "runyard/events"
FINAL_TAG = "runyard/final"
PARAMS_TAG = "runyard/params"
EVENT_TEXT = re.compile(r"^\[event (\d+)\]")


def tensorboard_root(settings: Settings) -> Path:
    return settings.tensorboard_root or settings.service_dir / "tensorboard"


def read_folder(folder: Path) -> Any:
    """TensorBoard's own reader over the run's folder, every value kept (no sampling)."""
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        TENSORS,
        EventAccumulator,
    )

    accumulator = EventAccumulator(str(folder), size_guidance={SCALARS: 0, TENSORS: 0})
    accumulator.Reload()
    return accumulator


def texts(accumulator: Any, tag: str) -> list[tuple[int, str]]:
    """(step, text) of a text tag."""
    if tag not in accumulator.Tags().get("tensors", []):
        return []
    return [(e.step, e.tensor_proto.string_val[0].decode()) for e in accumulator.Tensors(tag)]


class TensorBoardSink:
    def __init__(self, settings: Settings) -> None:
        self.root = tensorboard_root(settings)
        self._writers: dict[str, Any] = {}  # folder -> EventFileWriter

    def open(self, run: TrackedRun, tracker_run_id: str | None) -> tuple[str, bool]:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        folder = self.root / (run.team or "default") / run.folder_name
        key = str(folder)
        if key in self._writers:
            return key, False
        created = not (folder.is_dir() and any(folder.glob("events.out.tfevents.*")))
        team_folder(self.root, run.team or "default", run.folder_name)
        self._writers[key] = EventFileWriter(key, max_queue_size=1000, flush_secs=3600)
        private_files(folder, "events.out.tfevents.*")  # the writer made its file just now
        if created:
            text = "\n".join(f"{k}: {v}" for k, v in sorted(run.params.items()))
            self._write(key, [self._text(PARAMS_TAG, text)], step=0)
            self._writers[key].flush()
        return key, created

    def held(self, tracker_run_id: str, run: TrackedRun) -> Held:
        accumulator = read_folder(Path(tracker_run_id))
        scalars = accumulator.Tags().get("scalars", [])
        step = (
            max((e.step for e in accumulator.Scalars("loss")), default=0)
            if "loss" in scalars
            else 0
        )
        events = {
            int(m.group(1))
            for _, t in texts(accumulator, EVENTS_TAG)
            for m in [EVENT_TEXT.match(t)]
            if m
        }
        return Held(
            step=step, event_ids=frozenset(events), final=bool(texts(accumulator, FINAL_TAG))
        )

    def _text(self, tag: str, text: str) -> Any:
        from tensorboard.compat.proto import summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text")
        )
        tensor = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING,
            string_val=[text.encode()],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]
            ),
        )
        return summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)

    def _write(self, folder: str, values: list[Any], step: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        event = event_pb2.Event(
            wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values)
        )
        self._writers[folder].add_event(event)

    def log(
        self,
        tracker_run_id: str,
        run: TrackedRun,
        rows: list[StepRow],
        events: list[TrackedEvent],
        through_step: int,
    ) -> None:
        from tensorboard.compat.proto import summary_pb2

        for row in rows:
            values = [
                summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in row.figures.items()
            ]
            self._write(tracker_run_id, values, row.step)
        for event in events:
            self._write(tracker_run_id, [self._text(EVENTS_TAG, event.text)], event.step)
        self._writers[tracker_run_id].flush()  # on disk before the cursor says so

    def finish(self, tracker_run_id: str, run: TrackedRun, final: FinalSummary) -> None:
        text = "\n".join(f"{key}: {value}" for key, value in final.as_dict().items())
        self._write(tracker_run_id, [self._text(FINAL_TAG, text)], final.last_step or 0)
        self.release(tracker_run_id)

    def release(self, tracker_run_id: str) -> None:
        writer = self._writers.pop(tracker_run_id, None)
        if writer is not None:
            writer.close()
