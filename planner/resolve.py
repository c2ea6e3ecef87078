"""Turn a run spec's parallelism into the layout its ranks run with, and the plan behind it.

`parallelism: auto` (or any degree left out) means the planner's search: every unpinned
degree comes from `plan()` with the same inputs `runyard plan` takes, so the CLI shows the
answer the service reaches. What the user pinned stays pinned. The search prunes with the
contract's rules (`contract.layout`), the same ones the worker checks before training, so
the layout chosen is one the worker can run; a spec nothing can run is refused with the
planner's reason and the spec field to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from contract import (
    Float8Scaling,
    ModelShape,
    ParallelLayout,
    PipelineSchedule,
    Precision,
    Recompute,
    layout_problems,
)

from .advice import PlanError
from .calibration import Calibration
from .layout import PINNABLE
from .plan import plan
from .schemas import PlanResult

# Planner inputs named differently in the run spec.
_SPEC_FIELD = {
    "num_gpus": "nodes",
    "global_batch_tokens": "global_batch",
    "replica_groups": "fault_tolerance.replica_groups",
}


class LayoutError(ValueError):
    """A spec that cannot be laid out; `field` names the spec field to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Resolved:
    """What the service stores with a run: the worker's layout and the planner's answer."""

    layout: ParallelLayout
    plan: PlanResult


def planning_precision(precision: Precision) -> str:
    """The format the planner costs a run in. CPU runs (fp32, the dev cluster) are planned
    as BF16 on the cluster's GPU type: the numbers say what the same run would need there."""
    return "fp8" if precision is Precision.FP8 else "bf16"


def _check_pinned_degrees(pins: Mapping[str, Any], world_size: int, global_batch: int) -> None:
    """Refuse pins that cannot multiply out to the run's ranks, naming the spec field."""
    tp, pp, cp = pins.get("tp", 1), pins.get("pp", 1), pins.get("cp", 1)
    if world_size % (tp * pp * cp):
        raise LayoutError(
            "parallelism",
            f"tp x pp x cp = {tp * pp * cp} does not divide the {world_size} ranks "
            "(nodes x gpus_per_node)",
        )
    dp = pins.get("dp")
    if dp is None:
        return
    if dp * tp * pp * cp != world_size and {"tp", "pp", "cp"} <= pins.keys():
        raise LayoutError(
            "parallelism.dp",
            f"dp x tp x pp x cp = {dp * tp * pp * cp} but the run has {world_size} ranks "
            "(nodes x gpus_per_node)",
        )
    if world_size % dp:
        raise LayoutError(
            "parallelism.dp", f"dp ({dp}) does not divide the run's {world_size} ranks"
        )
    if global_batch % dp:
        raise LayoutError(
            "global_batch", f"global_batch ({global_batch}) must be divisible by dp ({dp})"
        )


def _schedule_pins(pins: dict[str, Any]) -> None:
    """A pinned schedule fixes what the search may choose for vp."""
    schedule = pins.get("schedule")
    if schedule is PipelineSchedule.ONE_F_ONE_B and "vp" not in pins:
        pins["vp"] = 1
    if schedule is PipelineSchedule.INTERLEAVED_1F1B and pins.get("vp", 1) < 2:
        raise LayoutError(
            "parallelism.vp", "schedule interleaved_1f1b needs vp pinned to 2 or more"
        )


def resolve_layout(
    *,
    shape: ModelShape,
    world_size: int,
    gpus_per_node: int,
    global_batch: int,
    seq_len: int,
    pinned: Mapping[str, Any],
    hardware: str,
    network: str,
    worker_precision: Precision,
    replica_groups: int | None = 1,
    calibration: Calibration | None = None,
) -> Resolved:
    """The fastest layout of `world_size` ranks that fits and honours every pin.

    `pinned` holds the spec's parallelism fields (None or absent: the planner chooses);
    `worker_precision` is what the ranks compute in unless the spec pins a precision;
    `replica_groups` the groups the run is split into (None: the planner chooses them with
    the layout; the plan's `fast_replica_groups` says how many, 0 for none); `calibration`
    the cluster's corrections from its own measured runs (planner/calibration.py).
    """
    pins = {name: value for name, value in pinned.items() if value is not None}
    _check_pinned_degrees(pins, world_size, global_batch)
    _schedule_pins(pins)
    precision = Precision(pins.get("precision", worker_precision))
    if "fp8_scaling" in pins and precision is not Precision.FP8:
        raise LayoutError(
            "parallelism.fp8_scaling",
            f"applies only to precision fp8 (this run computes in {precision.value}); "
            "pin precision: fp8 or leave fp8_scaling out",
        )
    try:
        result = plan(
            shape,
            hardware,
            world_size,
            seq_len,
            global_batch * seq_len,
            precision=planning_precision(precision),
            network=network,
            pinned={name: pins[name] for name in PINNABLE if name in pins},
            gpus_per_node=gpus_per_node,
            num_runners_up=0,
            replica_groups=replica_groups,
            calibration=calibration,
        )
    except PlanError as exc:
        advice = f"; what would help: {', '.join(exc.advice)}" if exc.advice else ""
        field = (
            f"parallelism.{exc.field}"
            if exc.field in PINNABLE
            else _SPEC_FIELD.get(exc.field, exc.field)
        )
        raise LayoutError(field, f"{exc.message}{advice}") from exc
    chosen = result.layout
    try:
        layout = ParallelLayout(
            dp=chosen.dp,
            tp=chosen.tp,
            pp=chosen.pp,
            cp=chosen.cp,
            vp=chosen.vp,
            schedule=pins.get("schedule")
            or (
                PipelineSchedule.INTERLEAVED_1F1B if chosen.vp > 1 else PipelineSchedule.ONE_F_ONE_B
            ),
            zero_stage=chosen.zero_stage,
            micro_batch_size=chosen.micro_batch_size,
            recompute=Recompute(chosen.recompute),
            precision=precision,
            compile=bool(pins.get("compile", False)),
            fp8_scaling=pins.get("fp8_scaling", Float8Scaling.TENSORWISE),
        )
    except ValidationError as exc:  # the schedule's own rules (vp and schedule disagree)
        message = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise LayoutError("parallelism.schedule", message) from exc
    # The search pruned with these same rules; checked again so a planner change that
    # breaks the contract is refused here, never discovered by a rank on the cluster.
    problems = layout_problems(shape, layout, seq_len, global_batch, gpus_per_node)
    if problems:
        raise LayoutError(f"parallelism.{problems[0].field}", problems[0].message)
    return Resolved(layout=layout, plan=result)
