"""What a run spec trains and how: its model's shape (read as the owner where it names their
files), and the layout and plan the planner resolves for it. The API plans a spec at
submission (runs/service.py); the reconciler plans it again when a run shrinks
(reconcile/placement.py)."""

from __future__ import annotations

from typing import Any

from contract import ModelShape, Precision, check_dataset, replica_layout_problems
from contract.dataset import BUILTIN_DATA
from planner.calibration import Calibration
from planner.hardware import hardware_named
from planner.presets import MODEL_PRESETS
from planner.resolve import LayoutError, Resolved, resolve_layout
from service.config import Settings, get_settings
from service.errors import InvalidSpec
from service.identity.gate import OwnerGate
from service.identity.service import OwnerUnavailable
from service.runs.schemas import HfModelSpec, RunSpec
from service.slurm.commands import SlurmError
from service.slurm.owner import RunOwner


def model_shape(spec: RunSpec) -> ModelShape | None:
    """The spec's model as a shape, or None for `from_hf` (its config.json is the owner's,
    read as them: `owner_inputs`); a LayoutError names the field when the worker cannot
    train it."""
    if isinstance(spec.model, ModelShape):
        shape = spec.model
    elif isinstance(spec.model, HfModelSpec):
        return None
    elif spec.model in MODEL_PRESETS:
        shape = MODEL_PRESETS[spec.model]
    else:
        raise LayoutError(
            "model",
            f"unknown preset '{spec.model}'; use one of {', '.join(MODEL_PRESETS)} "
            "or an explicit shape {layers, hidden, heads, kv_heads, ffn, vocab}",
        )
    return shape


def reads_files(spec: RunSpec) -> bool:
    """Whether planning the spec reads the owner's files (a data folder, a from_hf config)."""
    return isinstance(spec.model, HfModelSpec) or spec.data != BUILTIN_DATA


def acts_as_owner(spec: RunSpec) -> bool:
    """Whether checking the spec starts the owner's program: it reads their files, or runs
    their interpreter (`environment.python`, service/runs/environment.py)."""
    return reads_files(spec) or spec.environment is not None


def owner_inputs(
    spec: RunSpec, shape: ModelShape | None, owner: RunOwner | None, settings: Settings
) -> ModelShape:
    """The model's shape and the data's fit, read from the shared filesystem as the run's
    owner: a folder the owner cannot read fails here with the OS's words and the path,
    whatever the service itself could read. Builtin data and a preset read nothing."""
    if shape is not None and not reads_files(spec):
        problems = check_dataset(spec.data, shape, spec.seq_len, spec.eval_every)
        found: dict[str, Any] = {
            "shape": None,
            "problems": [{"field": p.field, "message": p.message} for p in problems],
        }
    elif owner is None:
        raise LayoutError("data", "a spec that names files is planned for its owner only")
    else:
        try:
            found = OwnerGate(settings).inspect(
                owner,
                from_hf=spec.model.from_hf if isinstance(spec.model, HfModelSpec) else None,
                model=shape.model_dump(mode="json") if shape else None,
                data=spec.data,
                seq_len=spec.seq_len,
                eval_every=spec.eval_every,
            )
        except SlurmError as exc:  # OwnerAccessError among them: sudo refused, no such user
            raise OwnerUnavailable(str(exc)) from exc
    for problem in found["problems"]:
        raise LayoutError(problem["field"], problem["message"])
    if shape is None:
        shape = ModelShape.model_validate(found["shape"])
    if shape.mlp != "swiglu":
        raise LayoutError("model.mlp", "the worker trains SwiGLU models only; use mlp: swiglu")
    return shape


def fp8_available(settings: Settings) -> bool:
    """FP8 needs GPUs with FP8 tensor cores (H100/H200); refuse it before any rank starts.
    `settings` are the cluster's the run is planned on (clusters.registry.planning_settings)."""
    if settings.accelerator == "cpu":
        return False
    try:
        return hardware_named(settings.hardware).peak_fp8_flops is not None
    except ValueError:
        return False


def worker_precision(settings: Settings) -> Precision:
    """What ranks compute in unless the spec pins a precision: fp32 on the CPU dev cluster
    (gloo), BF16 mixed precision on GPUs."""
    return Precision.FP32 if settings.accelerator == "cpu" else Precision.BF16


def plan_spec(
    spec: RunSpec,
    settings: Settings | None = None,
    owner: RunOwner | None = None,
    calibration: Calibration | None = None,
) -> tuple[ModelShape, Resolved]:
    """The layout and plan this spec runs with: every unpinned degree from the planner's
    search, as `runyard plan` answers, its files read as `owner`. Raises LayoutError naming
    the spec field to change; the API turns it into a 422 (`resolve`)."""
    settings = settings or get_settings()
    shape = owner_inputs(spec, model_shape(spec), owner, settings)
    return shape, plan_layout(spec, shape, settings, calibration)


def plan_layout(
    spec: RunSpec, shape: ModelShape, settings: Settings, calibration: Calibration | None = None
) -> Resolved:
    """The layout and plan of a spec whose model shape is known (its inputs were checked at
    submission): what the reconciler re-plans with when a run shrinks."""
    pinned = {} if spec.parallelism == "auto" else spec.parallelism.model_dump(exclude_none=True)
    if pinned.get("precision") == Precision.FP8 and not fp8_available(settings):
        where = (
            "the workers train on CPU"
            if settings.accelerator == "cpu"
            else f"{settings.hardware} has no FP8 tensor cores"
        )
        raise LayoutError("parallelism.precision", f"fp8 cannot run here ({where}); use bf16")
    if spec.checkpoint_every > spec.steps:
        raise LayoutError(
            "checkpoint_every",
            f"{spec.checkpoint_every} is more than steps ({spec.steps}); the run would only "
            "checkpoint at its end",
        )
    resolved = resolve_layout(
        shape=shape,
        world_size=spec.nodes * spec.gpus_per_node,
        gpus_per_node=spec.gpus_per_node,
        global_batch=spec.global_batch,
        seq_len=spec.seq_len,
        pinned=pinned,
        hardware=settings.hardware,
        network=settings.network,
        worker_precision=worker_precision(settings),
        # Pinned, none, or (fault_tolerance: auto) chosen with the layout by the planner.
        replica_groups=spec.planned_replica_groups,
        # This cluster's corrections from its own runs (service/plans/history.py).
        calibration=calibration,
    )
    # The contract's rule for the groups, checked again on what the planner chose: any
    # layout splits, as long as the groups divide its data parallel and the nodes.
    groups = replica_groups_of(resolved)
    problems = replica_layout_problems(resolved.layout, groups, spec.nodes) if groups > 1 else []
    for _, why in problems:
        raise LayoutError("fault_tolerance.replica_groups", why)
    return resolved


def replica_groups_of(resolved: Resolved) -> int:
    """The replica groups a resolved run trains as (1: none, classic recovery only)."""
    return max(1, resolved.plan.fast_replica_groups)


def resolve(
    spec: RunSpec,
    settings: Settings | None = None,
    owner: RunOwner | None = None,
    calibration: Calibration | None = None,
) -> tuple[ModelShape, Resolved]:
    """`plan_spec` for the API: a spec that cannot run is a 422 naming the field to change."""
    try:
        return plan_spec(spec, settings, owner, calibration)
    except LayoutError as exc:
        raise InvalidSpec(str(exc)) from exc


def stored_plan(resolved: Resolved) -> dict[str, Any]:
    """The plan as kept with the run (what `run show` prints), without the search's tallies."""
    return resolved.plan.model_dump(
        mode="json", exclude={"runners_up", "rejected", "rejected_examples"}
    )
