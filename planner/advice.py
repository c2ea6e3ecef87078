"""What to tell a user whose run has no layout: the reason, by how much, and what helps.

Every suggestion is checked by planning the changed request for real, so the advice
never names a change that would not fit either.
"""

from __future__ import annotations

from dataclasses import replace

from .hardware import GIB
from .layout import PINNABLE
from .search import Candidate, Request, SearchOutcome, search

MAX_GPUS_TO_SUGGEST = 131_072


class PlanError(ValueError):
    """No layout runs this request; `field` names the input to change, `advice` what helps."""

    def __init__(self, field: str, message: str, advice: tuple[str, ...] = ()) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.advice = advice


def no_layout_error(request: Request, outcome: SearchOutcome) -> PlanError:
    if outcome.closest_misfit is not None:
        return misfit_error(request, outcome.closest_misfit)
    for reason in ("indivisible", "unsupported"):
        if reason in outcome.examples:
            field = outcome.example_fields.get(reason, "")
            return PlanError(
                field if field in PINNABLE else "parallelism", outcome.examples[reason]
            )
    return PlanError("parallelism", f"no layout of {request.num_gpus} GPUs matches the pins")


def misfit_error(request: Request, closest: Candidate) -> PlanError:
    capacity = request.hardware.hbm_bytes / GIB
    need = closest.memory.total / GIB
    advice = tuple(_what_would_fit(request))
    layout = closest.layout
    message = (
        f"does not fit: the leanest layout (dp={layout.dp} tp={layout.tp} pp={layout.pp} "
        f"cp={layout.cp} zero={layout.zero_stage} recompute={layout.recompute}) needs "
        f"{need:.1f} GiB per GPU, {need - capacity:.1f} GiB more than the {capacity:.1f} GiB "
        f"of {request.hardware.name}. "
    )
    message += (
        ("Would fit: " + "; ".join(advice) + ".")
        if advice
        else (
            f"Nothing tried fits: not up to {MAX_GPUS_TO_SUGGEST} GPUs, fp8, full recompute or "
            "free tp/pp."
        )
    )
    return PlanError("num_gpus", message, advice)


def _fits(request: Request) -> Candidate | None:
    ranked = search(request, keep=1).ranked
    return ranked[0] if ranked else None


def _what_would_fit(request: Request) -> list[str]:
    """The single changes that make the request fit, each tried for real."""
    advice: list[str] = []
    gpus = request.num_gpus * 2
    while gpus <= MAX_GPUS_TO_SUGGEST:
        more = replace(request, num_gpus=gpus, pinned=replace(request.pinned, dp=None))
        if _fits(more):
            advice.append(f"{gpus} GPUs (--gpus {gpus})")
            break
        gpus *= 2
    fp8_possible = request.hardware.peak_fp8_flops is not None
    if request.precision == "bf16" and fp8_possible and _fits(replace(request, precision="fp8")):
        advice.append("fp8 (--precision fp8)")
    full = replace(request, pinned=replace(request.pinned, recompute="full"))
    if request.pinned.recompute not in (None, "full") and _fits(full):
        advice.append("full recompute (--recompute full)")
    if request.pinned.tp is not None or request.pinned.pp is not None:
        free = replace(request, pinned=replace(request.pinned, tp=None, pp=None, dp=None))
        found = _fits(free)
        if found:
            advice.append(f"a larger tp/pp (tp={found.layout.tp} pp={found.layout.pp})")
    return advice
