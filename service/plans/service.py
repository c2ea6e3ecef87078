"""The planner behind the API: plan a request, or admit a run's layout (or refuse it)."""

from __future__ import annotations

from sqlalchemy.orm import Session

from contract import ModelShape
from planner.advice import PlanError
from planner.calibration import Calibration
from planner.plan import plan
from planner.presets import MODEL_PRESETS
from planner.schemas import PlanResult
from service.config import Settings
from service.errors import InvalidSpec
from service.plans.history import cluster_calibration
from service.plans.schemas import PlanRequest


def shape_of(model: str | ModelShape) -> ModelShape:
    if isinstance(model, ModelShape):
        return model
    try:
        return MODEL_PRESETS[model]
    except KeyError:
        raise InvalidSpec(
            f"model: unknown preset '{model}'; use one of {', '.join(MODEL_PRESETS)} "
            "or an explicit shape {layers, hidden, heads, kv_heads, ffn, vocab}"
        ) from None


def _refusal(exc: PlanError, field_prefix: str = "") -> InvalidSpec:
    advice = f"; what would help: {', '.join(exc.advice)}" if exc.advice else ""
    return InvalidSpec(f"{field_prefix}{exc.field}: {exc.message}{advice}")


def calibration_for(
    session: Session, settings: Settings, hardware: str, uncalibrated: bool
) -> Calibration | None:
    """The cluster's corrections for a plan on `hardware`: None when asked for none, or
    when the plan is for another GPU type than this cluster's (its history says nothing
    of that one)."""
    if uncalibrated or hardware != settings.hardware:
        return None
    return cluster_calibration(session, settings)


def plan_request(session: Session, settings: Settings, req: PlanRequest) -> PlanResult:
    try:
        return plan(
            shape_of(req.model),
            req.hardware,
            req.gpus,
            req.seq_len,
            req.global_batch_tokens,
            precision=req.precision,
            network=req.network,
            pinned=req.pinned.model_dump(exclude_none=True),
            gpus_per_node=req.gpus_per_node,
            calibration=calibration_for(session, settings, req.hardware, req.uncalibrated),
        )
    except PlanError as exc:
        raise _refusal(exc) from exc
