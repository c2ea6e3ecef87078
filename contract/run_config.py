"""The resolved config one attempt's ranks train with."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from ._frozen import Frozen
from .entrypoint import Entrypoint, ProgressPattern, ScriptEnvironment, ScriptResume
from .fault_tolerance import ReplicaGroupConfig, replica_layout_problems
from .layout import ParallelLayout, layout_problems
from .model_shape import ModelShape

Figure = Literal["loss", "grad_norm"]


class ResumePoint(Frozen):
    """The newest COMMITTED checkpoint a new attempt starts from."""

    step: int = Field(ge=0, description="Optimizer steps completed when it was saved.")
    path: str = Field(description="Checkpoint folder (holds the DCP files and the marker).")


class SpikeRule(Frozen):
    """When a step's loss or gradient norm is a spike (issue 15; per run, RunSpec.spike).

    A value of one of `figures` is a spike when, with at least `min_history` finite values of
    the same figure from the steps before it (the last `window` of them; steps inside the
    warm-up are not judged, and a resumed attempt starts with no history), it is above BOTH
    mean + `z` x std of those values AND `ratio` x their mean.
    The two together keep a noisy-but-flat series (small std) and a tiny-but-steady one
    (small mean) from tripping it. A non-finite loss or gradient norm is always an anomaly,
    whatever this rule says. On a rollback the data of training steps
    [anomaly - skip_before, anomaly + skip_after] is skipped (never before the resume point).
    """

    enabled: bool = Field(default=True, description="Judge spikes; False: non-finite only.")
    figures: list[Figure] = Field(
        default_factory=lambda: list[Figure](["loss"]),
        description="What is judged for spikes. The gradient norm is not by default: it "
        "jumps often and harmlessly (clipping absorbs it); add it to roll back on its spikes.",
    )
    window: int = Field(default=100, ge=2, description="Recent steps a value is judged against.")
    min_history: int = Field(default=20, ge=2, description="Fewer finite values: no verdict.")
    z: float = Field(default=6.0, gt=0, description="Standard deviations above the mean.")
    ratio: float = Field(default=1.5, gt=1.0, description="And at least this x the mean.")
    skip_before: int = Field(default=2, ge=0, description="Steps of data skipped before it.")
    skip_after: int = Field(default=2, ge=0, description="Steps of data skipped after it.")
    max_rollbacks_at_step: int = Field(
        default=2,
        ge=1,
        description="Rollbacks for anomalies within skip_before + skip_after steps of each "
        "other before the next one stops the run (StopReason.REPEATED_ANOMALY) instead of "
        "rolling back again.",
    )


class DataSkip(Frozen):
    """From training step `from_step` on, the data position runs `steps` ahead of the step:
    the batches of `steps` steps are never trained on (a rollback past a spike)."""

    from_step: int = Field(ge=1, description="First training step whose data is shifted.")
    steps: int = Field(ge=1, description="How many steps of data are skipped.")


def data_step(step: int, skips: list[DataSkip] | tuple[DataSkip, ...]) -> int:
    """The data position (worker/data.py TokenBatches' step) of training step `step`."""
    return step + sum(skip.steps for skip in skips if step >= skip.from_step)


class WorkerRunConfig(Frozen):
    """Everything one rank needs to train its part of one attempt of a run."""

    run_id: int = Field(description="Service id of the run.")
    attempt_id: int = Field(description="Service id of this attempt (one Slurm allocation).")
    attempt_number: int = Field(ge=1, description="1 for the first attempt, then 2, 3, ...")
    name: str = Field(description="Run name, for logs.")
    model: ModelShape
    layout: ParallelLayout
    seq_len: int = Field(ge=8, description="Tokens per sequence.")
    global_batch: int = Field(ge=1, description="Sequences per optimizer step, all ranks.")
    steps: int = Field(ge=1, description="Optimizer steps for the whole run.")
    lr: float = Field(gt=0, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(default=10, ge=0, description="Linear warm-up, then cosine.")
    weight_decay: float = Field(default=0.1, ge=0)
    grad_clip: float = Field(default=1.0, gt=0, description="Global gradient-norm clip.")
    seed: int = Field(default=1234, description="Seed for weights and data order.")
    checkpoint_every: int = Field(ge=1, description="Save a checkpoint every N steps.")
    checkpoint_dir: str = Field(description="This run's checkpoint folder (shared filesystem).")
    keep_checkpoints: int = Field(default=3, ge=1, description="Committed checkpoints kept.")
    data: str = Field(default="builtin", description="'builtin' or a folder of token shards.")
    data_cache_dir: str = Field(description="Where the builtin corpus is packed into shards.")
    eval_every: int | None = Field(
        default=None,
        ge=1,
        description="Report the loss on the data's held-out split every N steps (a folder "
        "from `runyard data prepare`); None: no evaluation.",
    )
    resume_from: ResumePoint | None = Field(default=None, description="None: start fresh.")
    init_from_hf: str | None = Field(
        default=None,
        description="A Hugging Face Llama folder whose weights a fresh start (no resume_from) "
        "loads instead of a random init; None: random init from seed.",
    )
    spike: SpikeRule = Field(default_factory=SpikeRule, description="Loss-spike detection.")
    sdc_check_every: int | None = Field(
        default=None,
        ge=1,
        description="Compare data-parallel replicas' parameter checksums every N steps "
        "(worker/sdc.py); None: never.",
    )
    data_skips: list[DataSkip] = Field(
        default_factory=list,
        description="Data windows skipped by the service's rollbacks, in the order made.",
    )
    report_interval_s: float = Field(default=2.0, gt=0, description="Progress report period.")
    entrypoint: Entrypoint | None = Field(
        default=None, description="The user's training script instead of runyard's trainer."
    )
    environment: ScriptEnvironment | None = Field(
        default=None, description="The user's Python the entrypoint runs in; None: runyard's."
    )
    progress: ProgressPattern | None = Field(
        default=None,
        description="Read the entrypoint's steps and losses from rank 0's output (a script "
        "that never imports runyard); None: the script reports them itself.",
    )
    resume: ScriptResume | None = Field(
        default=None,
        description="The entrypoint's own save and resume flags: the launcher passes the "
        "folder and the resume point, and commits the checkpoints it finds complete there.",
    )
    fault_tolerance: ReplicaGroupConfig | None = Field(
        default=None, description="This attempt's replica group; None: one group, no peers."
    )

    @model_validator(mode="after")
    def _layout_fits(self) -> WorkerRunConfig:
        problems = layout_problems(self.model, self.layout, self.seq_len, self.global_batch)
        if problems:
            raise ValueError("; ".join(f"layout.{p.field}: {p.message}" for p in problems))
        if self.fault_tolerance is not None:
            groups = replica_layout_problems(self.layout, self.fault_tolerance.groups)
            if groups:
                raise ValueError("; ".join(f"layout.{field}: {why}" for field, why in groups))
        return self

    @model_validator(mode="after")
    def _script_fields_need_a_script(self) -> WorkerRunConfig:
        for name in ("environment", "progress", "resume"):
            if getattr(self, name) is not None and self.entrypoint is None:
                raise ValueError(f"{name}: only for an entrypoint script")
        return self

    @property
    def grad_accum(self) -> int:
        return self.global_batch // (self.layout.dp * self.layout.micro_batch_size)

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint_dir)
