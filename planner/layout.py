"""A candidate parallel layout and the rules that make one valid before any cost is paid.

The search builds hundreds of thousands of these, so they are slotted dataclasses, not
pydantic models; `schemas.py` turns the chosen ones into the API's JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from contract import LayoutProblem, ModelShape, degree_problems, schedule_problems

from .hardware import Hardware


class Reason(StrEnum):
    """Why a layout was not chosen; the keys of the plan's `rejected` counts. The first two
    are the contract's `ProblemKind`s, by value."""

    INDIVISIBLE = "indivisible"  # a degree does not divide what it must split
    UNSUPPORTED = "unsupported"  # a combination the worker's parallel code does not run
    DOES_NOT_FIT = "does_not_fit"  # over the GPU's memory
    SLOWER = "slower"  # valid and fits, but another layout is faster


RECOMPUTE_MODES = ("none", "selective", "full")
PINNABLE = ("dp", "tp", "pp", "cp", "zero_stage", "micro_batch_size", "recompute", "vp")
PRECISIONS = ("bf16", "fp8")


@dataclass(frozen=True, slots=True)
class Layout:
    """dp x cp x pp x tp ranks, plus sharding, batching and recomputation."""

    dp: int
    tp: int
    pp: int
    cp: int
    zero_stage: int
    micro_batch_size: int
    recompute: str
    precision: str
    vp: int = 1  # virtual pipeline stages per rank (interleaved 1F1B)

    @property
    def num_gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def grad_accum(self, global_batch_seqs: int) -> int:
        """Micro batches each data-parallel rank runs per optimizer step."""
        return global_batch_seqs // (self.dp * self.micro_batch_size)

    def stage_layers(self, num_layers: int) -> int:
        """Layers on the busiest pipeline rank (uneven splits round up).

        Llama 3 ran 126 layers on 16 stages by taking one layer off the first and last
        stage (Llama 3 paper, section 3.3.2), so an uneven split is allowed and charged
        at its slowest stage.
        """
        per_virtual_stage = -(-num_layers // (self.pp * self.vp))
        return min(num_layers, per_virtual_stage * self.vp)


Rejection = tuple[Reason, str, str]
"""Why a layout cannot run: the reason class, a sentence, and the layout field to change."""


def _first(problems: list[LayoutProblem]) -> Rejection | None:
    if not problems:
        return None
    return Reason(problems[0].kind.value), problems[0].message, problems[0].field


def check_degrees(
    model: ModelShape,
    hardware: Hardware,
    seq_len: int,
    gpus_per_node: int,
    precision: str,
    tp: int,
    cp: int,
    pp: int,
) -> Rejection | None:
    """The checks that depend on the degrees alone (the search prunes whole blocks on
    them): the contract's rules, which the worker applies too, plus the hardware's."""
    if precision == "fp8" and hardware.peak_fp8_flops is None:
        return Reason.UNSUPPORTED, f"{hardware.name} has no FP8 tensor cores", "precision"
    return _first(degree_problems(model, seq_len, tp=tp, cp=cp, pp=pp, gpus_per_node=gpus_per_node))


def check_schedule(
    model: ModelShape,
    global_batch_seqs: int,
    dp: int,
    pp: int,
    vp: int,
    micro_batch_size: int,
    zero_stage: int,
) -> Rejection | None:
    """The contract's checks on batching, the pipeline schedule and sharding."""
    return _first(
        schedule_problems(
            model,
            global_batch_seqs,
            dp=dp,
            pp=pp,
            vp=vp,
            micro_batch_size=micro_batch_size,
            zero_stage=zero_stage,
        )
    )


def check_layout(
    layout: Layout,
    model: ModelShape,
    hardware: Hardware,
    seq_len: int,
    global_batch_seqs: int,
    gpus_per_node: int,
) -> Rejection | None:
    """None if the layout can run, else the reason class and a sentence naming the field."""
    return check_degrees(
        model,
        hardware,
        seq_len,
        gpus_per_node,
        layout.precision,
        layout.tp,
        layout.cp,
        layout.pp,
    ) or check_schedule(
        model,
        global_batch_seqs,
        layout.dp,
        layout.pp,
        layout.vp,
        layout.micro_batch_size,
        layout.zero_stage,
    )
