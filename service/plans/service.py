"""The planner behind the API: plan a request, or admit a run's layout (or refuse it)."""

from __future__ import annotations

from contract import ModelShape
from planner.advice import PlanError
from planner.plan import plan
from planner.presets import MODEL_PRESETS
from planner.schemas import PlanResult
from service.errors import InvalidSpec
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


def plan_request(req: PlanRequest) -> PlanResult:
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
        )
    except PlanError as exc:
        raise _refusal(exc) from exc
