"""The training loop: one flat function, every synchronisation point commented.

Its concerns are components the loop calls around each step, each written once for the
plain and the replica-group runs: the step itself (worker/step.py train_step), when to
report (ReportCadence), when to save and what becomes of a save (CheckpointCadence), the
anomaly and silent-data-corruption checks (HealthChecks), the other replica groups
(CrossGroupSync) and the points where a test's fault may enter (FaultPoints).

Standalone use (no service; reports go to stdout and, with --metrics-file, a JSON-lines file):
    torchrun --nproc-per-node 2 -m worker.train --spec run.yaml --checkpoint-dir ckpt --resume
Under the service, entry.run_attempt fetches the config and calls train() with an HTTP reporter.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import torch
import torch.distributed as dist
import yaml

from contract import ExitCode, ResumePoint, WorkerRunConfig, check_dataset
from contract.run_config import data_step
from worker import checkpoint, sdc
from worker.anomaly import Anomaly, SpikeDetector, TrainingAnomalyError
from worker.cross_group import CrossGroupSync
from worker.data import TokenBatches, open_corpus
from worker.distributed import init_distributed, pick_device, shutdown_distributed
from worker.errors import CheckpointNotCommittedError, DoNotRetryError
from worker.evaluate import Evaluator
from worker.fault_points import NO_FAULTS, FaultPoints
from worker.faults import fault_points_from_env
from worker.launch import LaunchEnv, read_launch_env
from worker.parallel import ParallelDims, TrainingModel, build_training_model, check_supported
from worker.reporter import FileReporter, Reporter
from worker.step import (
    ReportCadence,
    WindowReport,
    build_optimizer,
    next_token_loss,
    train_step,
)

MIN_LR_RATIO = 0.1  # cosine decays to 10% of the peak (Llama 2/3 recipe)


@dataclass(frozen=True)
class TrainResult:
    """Where an attempt stopped: the service's `finish` body, and whether it stopped early
    (cancelled by the service, or the Slurm time limit near)."""

    final_step: int
    final_checkpoint_step: int
    stopped_early: bool


def lr_at(step: int, config: WorkerRunConfig) -> float:
    """Linear warm-up over `warmup_steps`, then cosine down to MIN_LR_RATIO x peak. Steps
    count from 1; a pure function of the step, so a resume needs no scheduler state."""
    if step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return config.lr * (MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * cosine)


def _check_resume_point(resume: ResumePoint) -> None:
    """All ranks agree on the resume point and that it can be loaded, so none is left
    waiting in a collective that the others never enter."""
    path = Path(resume.path)
    # A folder marked CORRUPT passes here: load() refuses it on every rank, and rank 0
    # reports it, so the service resumes from the one before instead of failing the run.
    loadable = checkpoint.is_committed(path) or checkpoint.is_corrupt(path)
    status = 0 if loadable else (1 if path.parent.is_dir() else 2)
    verdict = torch.tensor([status, resume.step, -resume.step])
    dist.all_reduce(verdict, op=dist.ReduceOp.MAX)  # sync: the worst rank's view wins
    worst, highest_step, lowest_step = verdict[0].item(), verdict[1].item(), -verdict[2].item()
    if highest_step != lowest_step:  # e.g. --resume on nodes whose filesystem views differ
        raise RuntimeError(f"ranks chose different resume steps ({lowest_step}..{highest_step})")
    if worst == 2:  # a node without the shared filesystem: another node may do
        raise FileNotFoundError(f"checkpoint folder {path.parent} is not visible on every node")
    if worst == 1:  # the service pointed at a save that never completed
        raise CheckpointNotCommittedError(
            f"resume_from {path} has no COMMITTED marker: resume from a committed checkpoint"
        )


def resume_from_checkpoint(
    resume: ResumePoint, state: dict[str, Any], reporter: Reporter, is_rank0: bool
) -> None:
    """Load the checkpoint the service chose into `state`, every rank together. A corrupt
    one is reported CORRUPT by rank 0, so the service resumes the next attempt from the one
    before; any other failure to load carries the step for entry.py's report (the service
    takes a checkpoint that fails to load twice the same way for corrupt). Shared by the
    plain and the replica-group loops."""
    _check_resume_point(resume)
    path = Path(resume.path)
    try:
        # collective: the ranks verify the checksums, then each reads the parts it needs
        checkpoint.load(path, state)
    except checkpoint.CheckpointCorruptError as exc:
        if is_rank0:
            print(f"refusing to resume: {exc}", flush=True)
            reporter.checkpoint(exc.step, exc.path, "CORRUPT", detail=exc.detail)
        raise
    except Exception as exc:
        exc.runyard_load_step = resume.step  # type: ignore[attr-defined]
        raise
    if is_rank0:
        print(f"resumed from {path} at step {resume.step}", flush=True)


@contextmanager
def _event_on_signal(signum: signal.Signals) -> Iterator[threading.Event]:
    """An event set when `signum` arrives (signal handlers can only be set on the main thread)."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return
    previous = signal.signal(signum, lambda *_: event.set())
    try:
        yield event
    finally:
        signal.signal(signum, previous)


def train(config: WorkerRunConfig, launch: LaunchEnv, reporter: Reporter) -> TrainResult:
    """Train `config` from its resume point to config.steps, checkpointing on the way."""
    check_supported(config.layout)  # before any collective: every rank refuses alike
    # So is data prepared for another vocabulary (the service asks the same at submission).
    problems = check_dataset(config.data, config.model, config.seq_len, config.eval_every)
    if problems:
        raise DoNotRetryError("; ".join(f"{p.field}: {p.message}" for p in problems))
    # The tests' faults (RUNYARD_FAULT), read once: those naming this run and attempt.
    fault_points = fault_points_from_env(config.name, config.attempt_number)
    if config.fault_tolerance is not None:
        from worker import fault_tolerance  # torchft: only replica-group runs import it

        fault_tolerance.leave_on_sigterm()
    device = pick_device(launch.local_rank)
    init_distributed(launch, device)
    sync = CrossGroupSync()  # a run without replica groups: nothing across groups
    try:
        if config.fault_tolerance is not None:
            # This rank's link to the same mesh coordinate in the other replica groups.
            sync = fault_tolerance.ReplicaGroupSync(
                config.fault_tolerance, config.run_id, launch.master_addr, launch.master_port
            )
        # Slurm sends SIGUSR2 ahead of the time limit (sbatch --signal, set by the service):
        # stop at the next step with a checkpoint instead of being killed between two.
        with _event_on_signal(signal.SIGUSR2) as time_limit_near:
            result = train_loop(config, reporter, device, time_limit_near, sync, fault_points)
        sync.close(failed=False)
        return result
    except BaseException as exc:
        _note_failed_step(exc)  # before the frames are cleared
        # The failed frame still holds the model, whose data-parallel state holds groups.
        # Dropped after destroy_process_group(), the group would be destroyed with the GIL
        # held while gloo's worker thread waits for the GIL: a hang instead of an exit
        # (pytorch/pytorch#56297). Free those locals now, while the group is still alive.
        traceback.clear_frames(exc.__traceback__)
        sync.close(failed=True)  # the other groups learn now, not at a collective timeout
        raise
    finally:
        shutdown_distributed()


def _note_failed_step(exc: BaseException) -> None:
    """Set `exc.runyard_step` to the step train_loop was at when `exc` escaped it: entry.py
    reports it, and the service compares a repeat failure by it (service/recovery/restart.py).
    Read from the loop's frame, so the loop needs no try block around every step (the loop
    over the steps must stay in train_loop itself, its helpers below it on the stack)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is train_loop.__code__ and "step" in tb.tb_frame.f_locals:
            exc.runyard_step = tb.tb_frame.f_locals["step"]  # type: ignore[attr-defined]
        tb = tb.tb_next


def train_loop(
    config: WorkerRunConfig,
    reporter: Reporter,
    device: torch.device,
    time_limit_near: threading.Event | None = None,
    sync: CrossGroupSync | None = None,
    fault_points: FaultPoints = NO_FAULTS,
) -> TrainResult:
    """Train on the default process group, which the caller set up (train() does; the layout
    tests train several layouts in one). `sync`: the run's other replica groups, if any
    (worker/cross_group.py); `fault_points`: where a test's faults enter (NO_FAULTS: none)."""
    sync = sync or CrossGroupSync()
    rank = dist.get_rank()
    is_rank0 = rank == 0  # the one flag that gates logging, reporting and commit markers
    dims = _group_mesh(config, sync, device)
    torch.manual_seed(config.seed + rank)  # per-rank streams; the weights use their own seed
    batches = _open_batches(config, is_rank0)
    evaluator = Evaluator(config, dims, device) if config.eval_every else None
    # Model and optimizers: this rank's shards of its pipeline stages, seeded alike everywhere.
    model = build_training_model(config, dims, device, next_token_loss)
    optimizers = [build_optimizer(part, config) for part in model.parts]  # one per stage
    trainer = checkpoint.TrainerState()
    state = checkpoint.training_state(model.parts, optimizers, trainer, rank)
    saves = CheckpointCadence(config, reporter, state, is_rank0, fault_points)
    saves.last_step = _resume(config, state, trainer, reporter, sync, is_rank0)
    reports = ReportCadence(config, reporter, device, trainer.step, is_rank0, time_limit_near)
    parameters = model.parameters()
    checks = HealthChecks(config, dims, parameters, device, sync, reporter, is_rank0, reports.nodes)
    writer = sync.writes_checkpoints()  # this group writes the run's checkpoints
    # sync (groups): the next step is agreed with the other replica groups (a replacement
    # heals here from a live one); without groups it is simply the one after.
    while (step := sync.next_step(trainer.step)) <= config.steps:
        step_started = time.monotonic()
        lr = lr_at(step, config)
        # No host sync inside: collectives (gradient reduction, the norm's all-reduce) are queued
        # on the device like kernels; ranks meet there, the host does not wait. Except after a
        # checkpoint step, once: the save's copy of the state to host memory runs beside this
        # step's forward and backward, and the update waits for it (on a GPU that copy waits
        # in turn for the device to reach it).
        # The data position is the step, shifted past the windows the service's rollbacks
        # skipped (contract.run_config.data_step): exact, and the same on every resume.
        position = data_step(step, config.data_skips)
        stepped = train_step(
            model, optimizers, batches, step, lr, config, dims, device, sync,
            saves.checkpointer.wait_for_staging, reports.update_timer, fault_points,
            data_position=position,
        )  # fmt: skip
        if stepped is None:  # a replica group failed during the step: train it again
            continue
        loss_sum, num_losses, grad_norm = stepped
        fault_points.after_update(step, rank, parameters)  # flip_param: one replica diverges
        loss_sum = fault_points.step_values(step, rank, loss_sum)  # nan_at_step: no sync
        reports.add(step, loss_sum, num_losses, grad_norm, lr)  # stays on the device
        trainer.step, trainer.data_step = step, position
        trainer.consumed_tokens += config.global_batch * config.seq_len
        stop, checkpoint_due, sdc_due = False, saves.due(step), checks.sdc_due(step)
        eval_due = evaluator is not None and evaluator.due(step)
        if reports.due(step) or checkpoint_due or eval_due or sdc_due:
            # sync (host and ranks): every rank stops after the same step (_close_window).
            evaluation = evaluator if eval_due else None
            stop = _close_window(step, reports, saves, checks, sdc_due, evaluation, model)
        # One writer per step: the group with participating rank 0 in this step's quorum.
        writer = sync.writes_checkpoints()
        saves.after_step(step, checkpoint_due, step == config.steps or stop, writer)
        fault_points.after_step(step, rank)  # after_step: a lost node; raise_after_step: a bug
        fault_points.step_end(step, rank, step_started, len(sync.shares()))  # pace_step
        if stop:
            reports.say_why_stopping(step)
            break

    saves.close()  # resumed at the last step: nothing in flight, a no-op
    # Stopped early, the run is not finished: the service resumes or cancels it. Of replica
    # groups, the writer of the last checkpoint says so.
    if is_rank0 and not reports.stopped and writer:
        reporter.finish(trainer.step, saves.last_step)
    return TrainResult(trainer.step, saves.last_step, reports.stopped)


def _close_window(
    step: int,
    reports: ReportCadence,
    saves: CheckpointCadence,
    checks: HealthChecks,
    sdc_due: bool,
    evaluator: Evaluator | None,
    model: TrainingModel,
) -> bool:
    """What every rank does at a report, on the same step: close the window, evaluate (if
    `evaluator`), open the next window, take the checkpoint interval the report carries and
    judge the window's health. Apart from train_loop so that its loop reads as the steps;
    returns whether every rank stops after this step."""
    # sync (host and ranks): the window's losses come back, with any rank's reason to stop,
    # so that every rank stops after the same step (ReportCadence.close).
    report = reports.close()
    if evaluator is not None:  # between windows: in no step's time
        _evaluate(evaluator, model, step, reports.reporter, reports.is_rank0)
    reports.open_next(step, report)
    saves.every = report.checkpoint_every or saves.every
    checks.judge(step, report, sdc_due, saves)  # before any save at this step
    return report.stop


def _group_mesh(
    config: WorkerRunConfig, sync: CrossGroupSync, device: torch.device
) -> ParallelDims:
    """This group's device mesh: the run's layout, with its share of data parallel (all of
    it for a run of one group)."""
    dims = ParallelDims.from_layout(sync.group_layout(config.layout), dist.get_world_size())
    dims.build_mesh(device.type)
    print(dims.describe_coordinates(), flush=True)  # every rank: the mesh it really built
    return dims


def _open_batches(config: WorkerRunConfig, is_rank0: bool) -> TokenBatches:
    """Data: rank 0 packs the builtin corpus (once per cache dir), the others wait for it."""
    if is_rank0:
        open_corpus(config.data, Path(config.data_cache_dir))
    dist.barrier()  # sync: the shards exist before any other rank maps them
    stream = open_corpus(config.data, Path(config.data_cache_dir))
    if stream.vocab > config.model.vocab:
        raise DoNotRetryError(f"data vocab {stream.vocab} exceeds model.vocab {config.model.vocab}")
    return TokenBatches(stream, config.seq_len, config.global_batch, config.seed)


def _resume(
    config: WorkerRunConfig,
    state: dict[str, Any],
    trainer: checkpoint.TrainerState,
    reporter: Reporter,
    sync: CrossGroupSync,
    is_rank0: bool,
) -> int:
    """Load the resume point, if any, and tell `sync`; rank 0 of a plain run deletes the
    commits above it (checkpoint.discard_abandoned). Returns the step the state is at (0:
    a fresh start), its checkpoint the newest committed one this attempt knows."""
    if config.resume_from is not None:
        resume_from_checkpoint(config.resume_from, state, reporter, is_rank0)
        if is_rank0 and trainer.step != config.resume_from.step:
            print(f"warning: resume_from.step is {config.resume_from.step}", flush=True)
    # A peer heals from exactly what a checkpoint holds; a resume sets the groups' step.
    sync.attach(state, trainer.step if config.resume_from is not None else None)
    # Replica groups keep what is on disk: a late group could delete a peer's fresh commit.
    if is_rank0 and sync.groups == 1:
        resumed = config.resume_from.step if config.resume_from is not None else 0
        for abandoned in checkpoint.discard_abandoned(config.checkpoint_path, resumed):
            print(f"deleted {abandoned.name}: above the resume point, not trusted", flush=True)
    return trainer.step


def _evaluate(
    evaluator: Evaluator, model: TrainingModel, step: int, reporter: Reporter, is_rank0: bool
) -> None:
    """The held-out loss at `step`; rank 0 prints and reports it."""
    val_loss = evaluator.loss(model)
    if is_rank0:
        print(f"eval step {step} val_loss {val_loss:.4f}", flush=True)
        reporter.validation(step, val_loss)


class CheckpointCadence:
    """Which steps save `state`, and what becomes of each save. Every rank saves on the
    same steps: every `every` steps, and the last. The service may move the interval while
    the run trains (the cluster's failures: its progress reply to rank 0, shared at the next
    report); a pinned one never moves. Rank 0 registers each commit (register_commit)."""

    def __init__(
        self,
        config: WorkerRunConfig,
        reporter: Reporter,
        state: dict[str, Any],
        is_rank0: bool,
        fault_points: FaultPoints,
    ) -> None:
        self.config, self.reporter, self.is_rank0 = config, reporter, is_rank0
        self.checkpointer = checkpoint.AsyncCheckpointer(
            config.checkpoint_path, state, fault_points=fault_points
        )
        self.every = config.checkpoint_every
        self.last_step = 0  # the newest committed checkpoint's step, as far as known

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.config.steps

    def committed(self, saved: checkpoint.SavedCheckpoint | None) -> None:
        if saved is not None and register_commit(saved, self.config, self.reporter, self.is_rank0):
            self.last_step = saved.step

    def after_step(self, step: int, due: bool, last: bool, writer: bool) -> None:
        """Once a step: commit the save in flight if it completed; a writer whose step is
        due (or the attempt's last) starts its save, the last one committed before it ends."""
        self.committed(self.checkpointer.poll())  # the previous save, if it completed meanwhile
        if not (writer and (due or last)):
            return
        # sync (host only): one save in flight at a time; by now the last one is usually
        # long done, checkpoint_every steps having passed.
        self.committed(self.checkpointer.wait())
        if self.is_rank0:
            target = str(checkpoint.step_folder(self.config.checkpoint_path, step).resolve())
            self.reporter.checkpoint(step, target, "WRITING")
        # sync: a barrier first clears a stale folder; then threads copy the state to host
        # memory (waited for before the next update) and write the files.
        self.checkpointer.save(step)
        if last:  # the attempt ends here: its final checkpoint must be committed first
            self.committed(self.checkpointer.wait())

    def close(self) -> None:
        """Commit the save in flight, if any (a stop for a rollback lets it commit too: it
        is from before what was found), and free the checkpointer's thread and host copy."""
        self.committed(self.checkpointer.wait())
        self.checkpointer.close()


class HealthChecks:
    """The checks that stop an attempt for the service to roll back, judged at a report.

    Loss spikes and non-finite values, judged on every rank from the report's figures (the
    same everywhere): found at the report that closes their step's window. Silent data
    corruption: replicas compare a parameter checksum every sdc_check_every steps (only
    layouts whose dp peers hold equal copies); replica groups always compare each rank with
    the same mesh coordinate in the other groups, whatever the layout."""

    def __init__(
        self,
        config: WorkerRunConfig,
        dims: ParallelDims,
        parameters: Sequence[torch.Tensor],
        device: torch.device,
        sync: CrossGroupSync,
        reporter: Reporter,
        is_rank0: bool,
        nodes: list[str],
    ) -> None:
        self.config, self.parameters, self.device, self.sync = config, parameters, device, sync
        self.reporter, self.is_rank0, self.nodes = reporter, is_rank0, nodes
        self.detector = SpikeDetector(config.spike, config.warmup_steps)
        self.within = sdc.replicas_are_equal(dims, config.layout.zero_stage)
        self.sdc_on = config.sdc_check_every is not None and (self.within or sync.groups > 1)
        self.key = sdc.replica_key(dims)
        self.last_clean_step: int | None = None  # the last comparison that found no mismatch
        if is_rank0 and config.sdc_check_every is not None and not self.sdc_on:
            print("sdc check off: no two data-parallel ranks hold equal parameters", flush=True)

    def sdc_due(self, step: int) -> bool:
        return self.sdc_on and step % (self.config.sdc_check_every or 1) == 0

    def judge(
        self, step: int, report: WindowReport, sdc_due: bool, saves: CheckpointCadence
    ) -> None:
        """Every rank, at the same report: raise TrainingAnomalyError for an anomaly in the
        window, SilentDataCorruptionError for replicas that differ (if `sdc_due`)."""
        anomaly = next(filter(None, map(self.detector.judge, report.steps)), None)
        if anomaly is not None:
            # Before any save at this step: checkpoints stay from before the anomaly.
            self._stop_for_anomaly(anomaly, saves)
        if sdc_due:
            # Before any save at this step too: none is written from corrupted weights.
            mismatch = sdc.compare_replicas(
                step,
                self.parameters,
                self.key,
                self.device,
                self.sync.gather_across_groups,
                self.within,
            )
            if mismatch is not None:
                self._stop_for_sdc(mismatch, saves)
            self.last_clean_step = step
            if self.is_rank0:
                self.reporter.sdc_clean(step)

    def _stop_for_anomaly(self, anomaly: Anomaly, saves: CheckpointCadence) -> None:
        """Every rank, at the same report: end the attempt for the service to roll back.

        A save still in flight is from before the anomaly (none starts after one is found),
        so it is let commit: the rollback may resume from it. Rank 0 tells the service what
        it saw (the run's timeline, and the rollback decision, read when the job ends), then
        every rank raises: the attempt fails, and the service resumes the run from the
        newest checkpoint before the anomaly with a window of data skipped
        (service/runs/rollback.py)."""
        saves.close()
        if self.is_rank0:
            print(f"anomaly: {anomaly.describe()}: stopping for a rollback", flush=True)
            self.reporter.anomaly(anomaly.step, anomaly.kind, anomaly.figure, anomaly.describe())
        raise TrainingAnomalyError(anomaly)

    def _stop_for_sdc(self, mismatch: sdc.Mismatch, saves: CheckpointCadence) -> None:
        """Every rank, at the same comparison: end the attempt for the service to drain the
        odd nodes and roll back to a checkpoint from before the last clean comparison.

        A save still in flight is let commit and registered like any other: if it is newer
        than the last clean comparison the service distrusts it (service/recovery/sdc.py), and
        if it was saved at that comparison it is the clean checkpoint the run resumes from."""
        saves.close()
        text = mismatch.describe(self.nodes)
        if self.is_rank0:
            print(f"sdc: {text}: stopping", flush=True)
            odd_nodes = sorted({self.nodes[r] for r in mismatch.ranks})
            self.reporter.sdc(
                mismatch.step, odd_nodes, self.last_clean_step, text, mismatch.outvoted
            )
        raise sdc.SilentDataCorruptionError(text)


def register_commit(
    saved: checkpoint.SavedCheckpoint, config: WorkerRunConfig, reporter: Reporter, is_rank0: bool
) -> bool:
    """A finished save: rank 0 registers the commit with the service, then prunes what it
    superseded; a save whose check before the commit failed is reported CORRUPT instead.
    True when `saved` is committed (every rank knows: only rank 0 can have `corrupt` set, and
    it then fails the attempt). Shared by the plain and the replica-group loops."""
    target = str(saved.path.resolve())
    if saved.corrupt is not None:  # rank 0's check before the commit failed: not committed
        print(f"checkpoint step {saved.step} failed verification: {saved.corrupt}", flush=True)
        reporter.checkpoint(saved.step, target, "CORRUPT", detail=saved.corrupt)
        return False
    if not is_rank0:
        return True
    known = reporter.checkpoint(
        saved.step, target, "COMMITTED", saved.num_bytes, saved.write_s, stall_s=saved.stall_s
    )
    print(
        f"checkpoint step {saved.step}: {saved.num_bytes} bytes in {saved.write_s:.2f}s "
        f"(training blocked {saved.blocking_s:.3f}s, {saved.num_steps_beside} steps beside "
        f"it {saved.excess_s:+.3f}s: cost {saved.stall_s:.3f}s)",
        flush=True,
    )
    # Prune only once the service knows of this commit: until then it would resume a new
    # attempt from an older one, which must still be on disk.
    if known:
        checkpoint.prune(config.checkpoint_path, config.keep_checkpoints)
    return True


def load_spec(path: Path, checkpoint_dir: str | None) -> WorkerRunConfig:
    """A WorkerRunConfig from YAML or JSON, with defaults for the ids a standalone run lacks."""
    try:
        raw: dict[str, Any] = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DoNotRetryError(f"cannot read spec {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise DoNotRetryError(f"spec {path} is not a mapping of WorkerRunConfig fields")
    raw.setdefault("run_id", 0)
    raw.setdefault("attempt_id", 0)
    raw.setdefault("attempt_number", 1)
    raw.setdefault("name", path.stem)
    raw.setdefault("data_cache_dir", ".runyard/data")
    if checkpoint_dir is not None:
        raw["checkpoint_dir"] = checkpoint_dir
    try:
        return WorkerRunConfig.model_validate(raw)
    except pydantic.ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'spec'}: {e['msg']}" for e in exc.errors()
        )
        raise DoNotRetryError(f"invalid spec {path}: {problems}") from exc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m worker.train", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--spec", type=Path, required=True, help="WorkerRunConfig as YAML or JSON")
    parser.add_argument("--checkpoint-dir", help="overrides the spec's checkpoint_dir")
    parser.add_argument(
        "--resume", action="store_true", help="resume from the newest committed checkpoint"
    )
    parser.add_argument(
        "--metrics-file", type=Path, help="also append reports as JSON lines (rank 0)"
    )
    args = parser.parse_args(argv)
    try:
        config = load_spec(args.spec, args.checkpoint_dir)
        launch = read_launch_env()
        if args.resume:
            resume = checkpoint.latest_committed(config.checkpoint_path)
            config = config.model_copy(update={"resume_from": resume})
            if launch.rank == 0:
                found = resume.path if resume else "no committed checkpoint, starting fresh"
                print(f"--resume: {found}", flush=True)
        reporter = (
            FileReporter(args.metrics_file)
            if args.metrics_file and launch.rank == 0
            else Reporter()
        )
        train(config, launch, reporter)
    except DoNotRetryError as exc:
        print(f"runyard worker: {exc}", file=sys.stderr, flush=True)
        return ExitCode.DO_NOT_RETRY
    return ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
