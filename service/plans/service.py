"""The planner behind the API: plan a request, or admit a run's layout (or refuse it)."""

from __future__ import annotations

from service.errors import InvalidSpec
from planner.advice import PlanError
from planner.plan import plan
from planner.presets import MODEL_PRESETS
from planner.schemas import PlanResult
from service.plans.schemas import PlanRequest
from contract import ModelShape, ParallelLayout


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


def admit(
    shape: ModelShape,
    layout: ParallelLayout,
    *,
    hardware: str,
    network: str,
    gpus_per_node: int,
    seq_len: int,
    global_batch: int,
) -> PlanResult:
    """Evaluate exactly the layout a run will use; refuse it (422) if it cannot fit.

    CPU runs (fp32, the dev cluster) are planned as BF16 on the cluster's GPU type: the
    numbers say what the same run would need and do there.
    """
    precision = layout.precision.value if layout.precision.value in ("bf16", "fp8") else "bf16"
    pinned: dict[str, int | str | None] = {
        "dp": layout.dp,
        "tp": layout.tp,
        "pp": layout.pp,
        "cp": layout.cp,
        "zero_stage": layout.zero_stage,
        "micro_batch_size": layout.micro_batch_size,
        "recompute": layout.recompute.value,
    }
    try:
        return plan(
            shape,
            hardware,
            layout.world_size,
            seq_len,
            global_batch * seq_len,
            precision=precision,
            network=network,
            pinned=pinned,
            gpus_per_node=gpus_per_node,
            num_runners_up=0,
        )
    except PlanError as exc:
        raise _refusal(exc, "plan: ") from exc
