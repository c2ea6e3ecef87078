"""What worker ranks send and receive."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from contract import StopReason
from service.models import AttemptState, RunState


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StepMetric(_In):
    step: int = Field(ge=0)
    loss: float
    tokens_per_s: float | None = Field(default=None, ge=0)
    step_time_s: float | None = Field(default=None, ge=0)
    lr: float | None = Field(default=None, ge=0, description="The learning rate the step used.")


class HeldOutLoss(_In):
    """The loss on the data's held-out split after `step` (`eval_every` in the run spec)."""

    step: int = Field(ge=0)
    loss: float


class NodeUpdateTimes(_In):
    """Each node's slowest rank's mean optimizer-update time over the report window ending
    at `step` (worker/stragglers.py): the figure the straggler rule compares."""

    step: int = Field(ge=0)
    update_s: dict[str, float] = Field(max_length=1280, description="node name -> seconds")


class ProtocolRange(BaseModel):
    """The worker protocol versions this service speaks (runyard-client's PROTOCOL_VERSION):
    a client asks at connect() and refuses a service that does not speak its own."""

    oldest: int = Field(ge=1, description="The oldest runyard-client protocol still answered.")
    newest: int = Field(ge=1, description="The protocol of the runyard-client it ships with.")


class ProgressReport(_In):
    rank: int = Field(ge=0)
    node: str = Field(default="", max_length=64)
    metrics: list[StepMetric] = Field(default_factory=list, max_length=10_000)
    validation: list[HeldOutLoss] = Field(default_factory=list, max_length=1_000)
    node_update_s: NodeUpdateTimes | None = Field(
        default=None, description="Per-node update times: the slow-node rule's input."
    )
    sdc_clean_step: int | None = Field(
        default=None,
        ge=0,
        description="The newest step at which data-parallel replicas' parameter checksums "
        "matched (worker/sdc.py): checkpoints up to it are known clean.",
    )


class ProgressAck(BaseModel):
    run_state: RunState
    attempt_state: AttemptState
    stop_requested: bool = Field(
        default=False,
        description="Finish this step, checkpoint and exit 0: preempted, or the end of a "
        "time-limited segment.",
    )
    stop_reason: StopReason | None = Field(
        default=None, description="Why the stop was asked: preempted or time_limit."
    )
    checkpoint_every: int | None = Field(
        default=None,
        ge=1,
        description="Steps between checkpoints from now on, as the service re-derives them "
        "from the cluster's observed failures (service/runs/live_interval.py); None: keep "
        "the config's (the user pinned it).",
    )


class CheckpointReport(_In):
    step: int = Field(ge=0)
    path: str = Field(min_length=1, max_length=4096)
    state: Literal["WRITING", "COMMITTED", "CORRUPT"] = Field(
        description="CORRUPT: its files failed their checksums, at the commit or at a load "
        "(`detail` says which file and how); it is never loaded again."
    )
    num_bytes: int | None = Field(default=None, ge=0)
    write_s: float | None = Field(default=None, ge=0)
    stall_s: float | None = Field(
        default=None,
        ge=0,
        description="With COMMITTED: what the save cost training, its blocking time plus "
        "how much slower the steps beside it ran; the run's checkpoint badput.",
    )
    detail: str = Field(default="", max_length=4000)


class FinishReport(_In):
    final_step: int = Field(ge=0)
    final_checkpoint_step: int | None = Field(default=None, ge=0)


class ErrorReport(_In):
    """A collective failure a rank caught (NCCL watchdog, ncclRemoteError, gloo reset...)."""

    rank: int = Field(ge=0)
    node: str = Field(default="", max_length=64)
    kind: str = Field(
        pattern=r"^(nccl|worker):[a-z_]+$",
        max_length=48,
        description="nccl:watchdog_timeout, nccl:remote_error, nccl:system_error, "
        "nccl:internal_error, nccl:connection_reset; worker:do_not_retry, worker:exception "
        "(any other exception), worker:checkpoint_load (the resume checkpoint failed to "
        "load), worker:anomaly (a loss spike or non-finite value at `step`: the run rolls "
        "back past it), worker:sdc (data-parallel replicas' parameters differ at `step`: "
        "`nodes` are drained, the run rolls back to before `clean_step`)",
    )
    message: str = Field(default="", max_length=4000)
    step: int | None = Field(
        default=None,
        ge=0,
        description="The step the rank failed at (worker:exception), or the checkpoint it "
        "failed to load (worker:checkpoint_load); the service compares repeat failures by it.",
    )
    nodes: list[str] = Field(
        default_factory=list,
        max_length=1280,
        description="worker:sdc: the nodes whose replicas disagreed with the others'.",
    )
    clean_step: int | None = Field(
        default=None,
        ge=0,
        description="worker:sdc: the attempt's last step at which the replicas matched.",
    )
    outvoted: bool = Field(
        default=False,
        description="worker:sdc: a strict majority of the run's replica groups agreed and "
        "outvoted this group: only it is replaced (from a live peer); the others train on.",
    )
