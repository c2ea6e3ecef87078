"""The planner's front door: `plan()` answers a run, `explain_does_not_fit()` says why not.

Pure functions over a model shape and a cluster slice: no database, no torch, no network,
so the CLI, the service and the benches all call the same code.
"""

from __future__ import annotations

from collections.abc import Mapping

from contract import ModelShape

from .advice import PlanError, misfit_error, no_layout_error
from .calibration import Calibration
from .collectives import Fabric
from .hardware import GIB, Network, hardware_named
from .layout import PINNABLE, PRECISIONS, RECOMPUTE_MODES
from .reliability import ReliabilityAssumptions, assess
from .replica_groups import GroupDecision, choose_groups
from .schemas import (
    Alternative,
    CheckpointPlan,
    DeclinedSplit,
    MemoryGiB,
    PlannedLayout,
    PlanResult,
    StepBreakdown,
    StepTerms,
)
from .search import TIE, Candidate, Pinned, Request, SearchOutcome, search
from .step_time import UNSCALED, StepScale, estimate_step, step_terms_s
from .transformer import model_flops_per_token

# Layouts costed with every replica-group count the contract allows: the count and the
# layout are chosen together from the fastest few (a layout a little slower as one group
# may fit G groups' unsharded states, or recover better). A pinned count is tried on every
# layout that fits as one group, fastest first.
GROUP_CANDIDATES = 64


def _group_candidates(replica_groups: int | None) -> int:
    """How many of the fastest layouts the replica-group choice looks at."""
    if replica_groups is None:
        return GROUP_CANDIDATES
    return 1 if replica_groups == 1 else 1_000_000


def make_request(
    model: ModelShape,
    hardware: str,
    num_gpus: int,
    seq_len: int,
    global_batch_tokens: int,
    precision: str = "bf16",
    network: str = "ib",
    pinned: Mapping[str, int | str | None] | None = None,
    gpus_per_node: int = 8,
    scale: StepScale = UNSCALED,
) -> Request:
    """Validate the inputs into a search request; a PlanError names the bad field."""
    try:
        chip = hardware_named(hardware)
    except ValueError as exc:
        raise PlanError("hardware", str(exc)) from None
    if network not in {n.value for n in Network}:
        raise PlanError("network", f"unknown network {network!r}; known: efa, ib")
    if precision not in PRECISIONS:
        raise PlanError("precision", f"unknown precision {precision!r}; known: bf16, fp8")
    if precision == "fp8" and chip.peak_fp8_flops is None:
        raise PlanError("precision", f"{chip.name} has no FP8 tensor cores; use bf16")
    if num_gpus < 1 or gpus_per_node < 1:
        raise PlanError("num_gpus", "num_gpus and gpus_per_node must be at least 1")
    if num_gpus % gpus_per_node and gpus_per_node % num_gpus:
        raise PlanError("num_gpus", f"{num_gpus} GPUs is not whole nodes of {gpus_per_node}")
    if seq_len < 2 or global_batch_tokens < seq_len or global_batch_tokens % seq_len:
        raise PlanError(
            "global_batch_tokens",
            f"{global_batch_tokens} tokens is not a whole number of {seq_len}-token sequences",
        )
    return Request(
        model=model,
        hardware=chip,
        network=Network(network),
        num_gpus=num_gpus,
        gpus_per_node=min(gpus_per_node, num_gpus),
        seq_len=seq_len,
        global_batch_seqs=global_batch_tokens // seq_len,
        precision=precision,
        pinned=_pinned(pinned or {}, num_gpus),
        scale=scale,
    )


def _pinned(values: Mapping[str, int | str | None], num_gpus: int) -> Pinned:
    unknown = set(values) - set(PINNABLE)
    if unknown:
        raise PlanError(sorted(unknown)[0], f"cannot be pinned; pin one of {', '.join(PINNABLE)}")
    given = {k: v for k, v in values.items() if v is not None}
    recompute = given.pop("recompute", None)
    if recompute is not None and recompute not in RECOMPUTE_MODES:
        raise PlanError("recompute", f"{recompute!r} is not one of none, selective, full")
    degrees: dict[str, int] = {}
    for name, value in given.items():
        if not isinstance(value, int) or value < (0 if name == "zero_stage" else 1):
            raise PlanError(name, f"must be a positive whole number, not {value!r}")
        degrees[name] = value
    if degrees.get("zero_stage", 0) > 3:
        raise PlanError("zero_stage", "must be 0, 1, 2 or 3")
    product = 1
    for name in ("dp", "tp", "pp", "cp"):
        product *= degrees.get(name, 1)
    if num_gpus % product or (
        len({"dp", "tp", "pp", "cp"} & degrees.keys()) == 4 and product != num_gpus
    ):
        raise PlanError(
            "parallelism", f"dp x tp x pp x cp = {product} does not match {num_gpus} GPUs"
        )
    return Pinned(recompute=str(recompute) if recompute else None, **degrees)


def plan(
    model: ModelShape,
    hardware: str,
    num_gpus: int,
    seq_len: int,
    global_batch_tokens: int,
    precision: str = "bf16",
    network: str = "ib",
    pinned: Mapping[str, int | str | None] | None = None,
    gpus_per_node: int = 8,
    reliability: ReliabilityAssumptions | None = None,
    num_runners_up: int = 5,
    calibration: Calibration | None = None,
    replica_groups: int | None = None,
) -> PlanResult:
    """The fastest layout that fits, with its memory, speed and failure plan.

    `replica_groups`: the replica groups the run is split into for the fast recovery
    path (1: none, classic recovery only); None: the planner chooses the count together
    with the layout, for the most expected throughput (planner/replica_groups.py).

    `calibration`: the cluster's corrections from its own measured runs
    (planner/calibration.py): the search ranks layouts with them, and the checkpoint and
    restart figures use them; None plans from the published figures alone.

    Raises PlanError when nothing fits or nothing valid matches the pins, with the reason
    and (for memory) by how much and what would help.
    """
    request, outcome = _searched(
        model,
        hardware,
        num_gpus,
        seq_len,
        global_batch_tokens,
        precision,
        network,
        pinned,
        gpus_per_node,
        keep=max(num_runners_up + 1, _group_candidates(replica_groups)),
        scale=calibration.scale if calibration is not None else UNSCALED,
    )
    if not outcome.ranked:
        raise no_layout_error(request, outcome)
    if calibration is not None:
        reliability = calibration.reliability(reliability)
    decision = choose_groups(
        request, outcome.ranked, reliability or ReliabilityAssumptions(), replica_groups
    )
    if decision is None:
        raise PlanError(
            "replica_groups",
            f"no layout that fits splits into {replica_groups} replica groups of whole nodes "
            "and still fits (the groups divide data parallel and the nodes, and ZeRO shards "
            "only inside a group); pin another count or use fault_tolerance: auto",
        )
    # The chosen layout as planned with its groups first, then the runners-up.
    chosen = decision.chosen.candidate
    others = [c for c in outcome.ranked if c.layout != chosen.layout]
    outcome.ranked = [chosen, *others][: num_runners_up + 1]
    return _result(request, outcome, reliability, calibration, decision)


def explain_does_not_fit(
    model: ModelShape,
    hardware: str,
    num_gpus: int,
    seq_len: int,
    global_batch_tokens: int,
    precision: str = "bf16",
    network: str = "ib",
    pinned: Mapping[str, int | str | None] | None = None,
    gpus_per_node: int = 8,
) -> str | None:
    """How far the nearest layout is over memory, and what would help; None if one fits.

    Also None when no layout is valid at all (a pin that does not divide): `plan()` raises
    that reason, which is not about memory.
    """
    request, outcome = _searched(
        model,
        hardware,
        num_gpus,
        seq_len,
        global_batch_tokens,
        precision,
        network,
        pinned,
        gpus_per_node,
        keep=1,
    )
    if outcome.ranked or outcome.closest_misfit is None:
        return None
    return misfit_error(request, outcome.closest_misfit).message


def _searched(
    model: ModelShape,
    hardware: str,
    num_gpus: int,
    seq_len: int,
    global_batch_tokens: int,
    precision: str,
    network: str,
    pinned: Mapping[str, int | str | None] | None,
    gpus_per_node: int,
    keep: int,
    scale: StepScale = UNSCALED,
) -> tuple[Request, SearchOutcome]:
    """Validate the inputs and search their layouts, keeping the `keep` fastest that fit."""
    request = make_request(
        model,
        hardware,
        num_gpus,
        seq_len,
        global_batch_tokens,
        precision,
        network,
        pinned,
        gpus_per_node,
        scale,
    )
    return request, search(request, keep=keep)


def _declined(decision: GroupDecision | None) -> DeclinedSplit | None:
    split = decision.best_split if decision is not None else None
    if decision is None or split is None or split.reliability.goodput_fast is None:
        return None
    return DeclinedSplit(
        replica_groups=split.groups,
        layout=_planned(split.candidate),
        step_time_s=split.candidate.step.total_s,
        goodput_fast=split.reliability.goodput_fast,
        throughput_ratio=split.throughput_per_s / decision.chosen.throughput_per_s,
    )


def _no_groups_because(
    decision: GroupDecision | None, declined: DeclinedSplit | None
) -> str | None:
    """Why `fault_tolerance: auto` planned no replica groups (None: it planned some, or G
    was pinned); `declined` is the best split it turned down (`_declined`)."""
    if decision is None or decision.pinned or decision.chosen.groups > 1:
        return None
    chosen = decision.chosen
    if declined is not None:
        ratio, lay = declined.throughput_ratio, declined.layout
        verdict = (
            f"{1 - ratio:.1%} less expected throughput (tokens/s x goodput)"
            if ratio < 1
            else f"{ratio - 1:.1%} more expected throughput (tokens/s x goodput), within "
            f"the models' resolution ({TIE:.1%}), and groups are planned only where they "
            "clearly pay"
        )
        return (
            f"the best split, {declined.replica_groups} replica groups at dp={lay.dp} "
            f"tp={lay.tp} pp={lay.pp} cp={lay.cp}, steps {declined.step_time_s:.2f} s "
            f"against {chosen.candidate.step.total_s:.2f} s for a goodput of "
            f"{declined.goodput_fast:.1%} against {chosen.reliability.goodput:.1%}: {verdict}"
        )
    if decision.splittable:
        return (
            f"none of the {decision.considered} fastest layouts still fits in memory split "
            "into replica groups (ZeRO shards only inside a group)"
        )
    return (
        f"none of the {decision.considered} fastest layouts splits into replica groups "
        "(a count must divide data parallel and the nodes)"
    )


def _planned(candidate: Candidate) -> PlannedLayout:
    lay = candidate.layout
    return PlannedLayout(
        dp=lay.dp,
        tp=lay.tp,
        pp=lay.pp,
        cp=lay.cp,
        vp=lay.vp,
        zero_stage=lay.zero_stage,
        micro_batch_size=lay.micro_batch_size,
        grad_accum=candidate.grad_accum,
        recompute=lay.recompute,
        precision=lay.precision,
    )


def _speed(request: Request, candidate: Candidate) -> tuple[float, float, float]:
    """(tokens/s, MFU, model TFLOP/s per GPU) of a candidate."""
    tokens_per_s = request.global_batch_seqs * request.seq_len / candidate.step.total_s
    flops = model_flops_per_token(request.model, request.seq_len) * tokens_per_s
    per_gpu = flops / request.num_gpus
    return tokens_per_s, per_gpu / request.hardware.peak_bf16_flops, per_gpu / 1e12


def _published_figures(request: Request, best: Candidate) -> tuple[float, StepTerms]:
    """The chosen layout's step time from the published figures alone, and its split into
    compute and communication: what the service stores to calibrate later plans from."""
    fabric = Fabric.of(request.hardware, request.network, request.gpus_per_node)
    args = (request.model, request.hardware, fabric, best.layout, request.seq_len)
    step = estimate_step(*args, best.grad_accum).total_s
    compute, communication = step_terms_s(*args, best.grad_accum)
    return step, StepTerms(compute_s=compute, communication_s=communication)


def _result(
    request: Request,
    outcome: SearchOutcome,
    assumptions: ReliabilityAssumptions | None,
    calibration: Calibration | None = None,
    decision: GroupDecision | None = None,
) -> PlanResult:
    best = outcome.ranked[0]
    uncalibrated_step_s, terms = _published_figures(request, best)
    tokens_per_s, mfu, tflops = _speed(request, best)
    rel = (
        decision.chosen.reliability
        if decision is not None
        else assess(
            request.model, request.num_gpus, request.gpus_per_node, best.step.total_s, assumptions
        )
    )
    declined = _declined(decision)
    mem = best.memory
    runners_up = []
    for other in outcome.ranked[1:]:
        other_tokens, other_mfu, _ = _speed(request, other)
        runners_up.append(
            Alternative(
                layout=_planned(other),
                step_time_s=other.step.total_s,
                tokens_per_s=other_tokens,
                mfu=other_mfu,
                memory_gib_per_gpu=other.memory.total / GIB,
            )
        )
    step = best.step
    return PlanResult(
        hardware=request.hardware.name,
        network=request.network.value,
        num_gpus=request.num_gpus,
        gpus_per_node=request.gpus_per_node,
        seq_len=request.seq_len,
        global_batch_tokens=request.global_batch_seqs * request.seq_len,
        num_params=request.model.num_params,
        layout=_planned(best),
        memory_gib_per_gpu=MemoryGiB(
            params=mem.params / GIB,
            grads=mem.grads / GIB,
            optimizer=mem.optimizer / GIB,
            activations=mem.activations / GIB,
            overhead=mem.overhead / GIB,
            total=mem.total / GIB,
            capacity=request.hardware.hbm_bytes / GIB,
        ),
        step_time_s=step.total_s,
        step_breakdown_s=StepBreakdown(
            compute_s=step.compute_s,
            tp_comm_s=step.tp_comm_s,
            cp_comm_s=step.cp_comm_s,
            bubble_s=step.bubble_s,
            pp_comm_s=step.pp_comm_s,
            dp_comm_s=step.dp_comm_s,
            optimizer_s=step.optimizer_s,
        ),
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / request.num_gpus,
        mfu=mfu,
        tflops_per_gpu=tflops,
        mtbi_h=rel.mtbi_s / 3600,
        checkpoint=CheckpointPlan(
            size_gib=rel.checkpoint_bytes / GIB,
            write_s=rel.checkpoint_write_s,
            stall_s=rel.checkpoint_stall_s,
            interval_s=rel.checkpoint_interval_s,
            interval_steps=rel.checkpoint_interval_steps,
            fast_interval_s=rel.fast_checkpoint_interval_s,
            fast_interval_steps=rel.fast_checkpoint_interval_steps,
        ),
        goodput=rel.goodput,
        goodput_fast=rel.goodput_fast,
        fast_replica_groups=rel.replica_groups,
        declined_split=declined,
        no_groups_because=_no_groups_because(decision, declined),
        lost_s_per_interruption={
            "classic": rel.classic_lost_s,
            **({"fast": rel.fast_lost_s} if rel.fast_lost_s is not None else {}),
        },
        spare_nodes=rel.spare_nodes,
        runners_up=runners_up,
        rejected=dict(outcome.rejected),
        rejected_examples=dict(outcome.examples),
        calibration=calibration.applied_schema() if calibration is not None else None,
        uncalibrated_step_time_s=uncalibrated_step_s,
        step_terms_s=terms,
    )
