"""Enumerate every layout of a run, cost the valid ones, and count why the rest lost.

The space is dp x tp x pp x cp x zero x micro batch x recompute x vp. Whole blocks that
fail on their degrees alone are counted without being built; memory (cheap) is checked
before step time (dearer), and per-layer costs are cached, so 405B on 10,240 GPUs plans
in well under a second.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from contract import ModelShape

from .collectives import Fabric
from .hardware import Hardware, Network
from .layout import RECOMPUTE_MODES, Layout, Reason, check_degrees, check_schedule
from .memory import MemoryBreakdown, memory_per_gpu
from .step_time import UNSCALED, StepScale, StepTime, estimate_step

ZERO_STAGES = (0, 1, 2, 3)
MAX_MICRO_BATCH = 16
TIE = 0.005  # step times this close are the same to a model of this accuracy
# Context-parallel chunks shorter than this leave ring attention waiting on its transfers
# and its kernels on short blocks; Megatron's long-context recipes keep >= 2K per rank.
MIN_CP_CHUNK_TOKENS = 2048


@dataclass(frozen=True, slots=True)
class Pinned:
    """Parts of the layout the user fixed; None leaves that part to the search."""

    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    zero_stage: int | None = None
    micro_batch_size: int | None = None
    recompute: str | None = None
    vp: int | None = None


@dataclass(frozen=True, slots=True)
class Request:
    """One planning question: a model, a cluster slice, a batch."""

    model: ModelShape
    hardware: Hardware
    network: Network
    num_gpus: int
    gpus_per_node: int
    seq_len: int
    global_batch_seqs: int
    precision: str
    pinned: Pinned = Pinned()
    # The cluster's own corrections of the step-time model (planner/calibration.py), which
    # rank the layouts as they would measure here; UNSCALED: the published-figure model.
    scale: StepScale = UNSCALED


@dataclass(frozen=True, slots=True)
class Candidate:
    """A valid layout with its memory and step time."""

    layout: Layout
    grad_accum: int
    memory: MemoryBreakdown
    step: StepTime


@dataclass
class SearchOutcome:
    """The fitting layouts fastest first, and the tally of the others."""

    ranked: list[Candidate] = field(default_factory=list)
    rejected: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)  # one sentence per reason
    example_fields: dict[str, str] = field(default_factory=dict)  # the layout field of each
    closest_misfit: Candidate | None = None  # the valid layout nearest to fitting

    def reject(self, reason: Reason, sentence: str, layout_field: str = "", count: int = 1) -> None:
        self.rejected[reason.value] += count
        if reason.value not in self.examples:
            self.examples[reason.value] = sentence
            self.example_fields[reason.value] = layout_field


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _choices(pinned: int | None, free: list[int]) -> list[int]:
    return [pinned] if pinned is not None else free


def _micro_batches(request: Request, dp: int) -> list[int]:
    pinned = request.pinned.micro_batch_size
    if pinned is not None:
        return [pinned]
    per_rank = request.global_batch_seqs // dp if request.global_batch_seqs % dp == 0 else 1
    return [b for b in (1, 2, 4, 8, MAX_MICRO_BATCH) if per_rank % b == 0] or [1]


def _virtual_stages(request: Request, pp: int) -> list[int]:
    if request.pinned.vp is not None:
        return [request.pinned.vp]
    if pp == 1:
        return [1]
    # Interleaving splits each rank's layers into vp equal chunks.
    return _divisors(-(-request.model.layers // pp))


def _degree_blocks(request: Request) -> list[tuple[int, int, int, int]]:
    """Every (dp, tp, pp, cp) whose product is the GPU count, honouring pins."""
    n, pinned = request.num_gpus, request.pinned
    blocks = []
    for tp in _choices(pinned.tp, [d for d in _divisors(n) if d <= request.gpus_per_node]):
        if n % tp:
            continue
        cps = [
            d for d in _divisors(n // tp) if d == 1 or request.seq_len // d >= MIN_CP_CHUNK_TOKENS
        ]
        for cp in _choices(pinned.cp, cps):
            if n % (tp * cp):
                continue
            pps = [d for d in _divisors(n // (tp * cp)) if d <= request.model.layers]
            for pp in _choices(pinned.pp, pps):
                if n % (tp * cp * pp):
                    continue
                dp = n // (tp * cp * pp)
                if pinned.dp is None or pinned.dp == dp:
                    blocks.append((dp, tp, pp, cp))
    return blocks


def search(request: Request, keep: int = 6) -> SearchOutcome:
    """All layouts of `request` costed; the best `keep` that fit returned fastest first."""
    outcome = SearchOutcome()
    fabric = Fabric.of(request.hardware, request.network, request.gpus_per_node)
    model, pinned = request.model, request.pinned
    zeros = _choices(pinned.zero_stage, list(ZERO_STAGES))
    recomputes = [pinned.recompute] if pinned.recompute else list(RECOMPUTE_MODES)
    fitting: list[Candidate] = []
    for dp, tp, pp, cp in _degree_blocks(request):
        block = len(zeros) * len(recomputes) * len(_virtual_stages(request, pp))
        block *= len(_micro_batches(request, dp))
        bad = check_degrees(
            model,
            request.hardware,
            request.seq_len,
            request.gpus_per_node,
            request.precision,
            tp,
            cp,
            pp,
        )
        if bad:
            outcome.reject(*bad, count=block)
            continue
        for vp in _virtual_stages(request, pp):
            for mb in _micro_batches(request, dp):
                for zero in zeros:
                    bad = check_schedule(model, request.global_batch_seqs, dp, pp, vp, mb, zero)
                    if bad:
                        outcome.reject(*bad, count=len(recomputes))
                        continue
                    for recompute in recomputes:
                        layout = Layout(dp, tp, pp, cp, zero, mb, recompute, request.precision, vp)
                        _cost(request, fabric, layout, outcome, fitting)
    fitting.sort(key=lambda c: c.step.total_s)
    if fitting:
        # Below the model's resolution, prefer the simpler layout: fewer virtual stages,
        # less context and pipeline parallelism, less sharding, less recomputation.
        near = [c for c in fitting if c.step.total_s <= fitting[0].step.total_s * (1 + TIE)]
        simplest = min(near, key=_complexity)
        fitting.remove(simplest)
        fitting.insert(0, simplest)
    outcome.ranked = fitting[:keep]
    if len(fitting) > 1:
        best = fitting[0].step.total_s
        outcome.reject(
            Reason.SLOWER,
            f"slower than the best layout's {best:.2f} s step",
            count=len(fitting) - 1,
        )
    return outcome


def _complexity(candidate: Candidate) -> tuple[int, ...]:
    lay = candidate.layout
    rank = RECOMPUTE_MODES.index(lay.recompute)
    return (lay.vp, lay.cp, lay.pp, lay.tp, lay.zero_stage, rank, -lay.micro_batch_size)


def _cost(
    request: Request,
    fabric: Fabric,
    layout: Layout,
    outcome: SearchOutcome,
    fitting: list[Candidate],
) -> None:
    """Cost one valid layout: memory first, step time only if it fits."""
    grad_accum = layout.grad_accum(request.global_batch_seqs)
    memory = memory_per_gpu(
        request.model, layout, request.seq_len, grad_accum, request.hardware.fused_loss
    )
    capacity = request.hardware.hbm_bytes
    if memory.total > capacity:
        outcome.reject(
            Reason.DOES_NOT_FIT,
            f"needs {memory.total / 2**30:.1f} GiB per GPU of {capacity / 2**30:.1f} GiB",
        )
        closest = outcome.closest_misfit
        if closest is None or memory.total < closest.memory.total:
            step = estimate_step(
                request.model,
                request.hardware,
                fabric,
                layout,
                request.seq_len,
                grad_accum,
                request.scale,
            )
            outcome.closest_misfit = Candidate(layout, grad_accum, memory, step)
        return
    step = estimate_step(
        request.model, request.hardware, fabric, layout, request.seq_len, grad_accum, request.scale
    )
    fitting.append(Candidate(layout, grad_accum, memory, step))
