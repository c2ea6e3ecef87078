"""Where one step's time goes, cause by cause, for `runyard plan --explain`.

The step-time model already splits a step into compute and each kind of communication;
this module opens up compute too (GEMMs, attention, memory-bound ops, recomputation,
kernel launches) and says, for the two efficiencies that matter most, what the model
assumed and why, so a user can see why the planner expects what it expects.
"""

from __future__ import annotations

from dataclasses import dataclass

from contract import ModelShape

from .attention import ATTENTION_BACKWARD_RATIO, kernel_efficiency
from .collectives import Fabric
from .hardware import Hardware, Network, hardware_named
from .layout import Layout
from .step_time import step_parts
from .transformer import attention_forward_flops, layer_matmul_params


@dataclass(frozen=True, slots=True)
class StepCause:
    """One cause of step time: seconds per step and a short reason."""

    cause: str
    seconds: float
    why: str


def explain_step(
    model: ModelShape,
    hardware: Hardware,
    fabric: Fabric,
    layout: Layout,
    seq_len: int,
    grad_accum: int,
) -> list[StepCause]:
    """Every cause of one step's time on the busiest rank; they add up to the step time."""
    parts = step_parts(model, hardware, fabric, layout, seq_len, grad_accum)
    step, layer, tokens, extra = parts.step, parts.layer, parts.tokens, parts.logits_s
    per_step = grad_accum * parts.stage_layers
    fwd_eff, bwd_eff = kernel_efficiency(hardware, seq_len / layout.cp, model.head_dim, True)
    kernel_keys = seq_len // layout.cp
    gemm_flops = 3 * 2.0 * tokens * layer_matmul_params(model) / layout.tp
    gemm_share = gemm_flops / layer.gemm_s / hardware.peak_flops(layout.precision)
    attention_flops = (1 + ATTENTION_BACKWARD_RATIO) * attention_forward_flops(
        model, tokens, seq_len, layout.tp
    )
    attention_share = attention_flops / layer.attention_s / hardware.peak_bf16_flops
    return [
        StepCause(
            "gemms",
            per_step * layer.gemm_s,
            f"{layout.precision} matrix products at {gemm_share:.0%} of peak (large ones reach "
            f"{hardware.gemm_efficiency:.0%}; tiles and waves cost thin or short shapes more)",
        ),
        StepCause(
            "attention",
            per_step * layer.attention_s,
            f"{attention_share:.0%} of BF16 peak overall; {hardware.attention_kernel.name} over "
            f"{kernel_keys:,} keys, head dim {model.head_dim}: forward {fwd_eff:.0%}, "
            f"backward {bwd_eff:.0%} (published curves)"
            + (
                f"; cp={layout.cp}: that causal call and {layout.cp - 1} non-causal ones "
                f"over {kernel_keys // 2:,} keys per ring pass (load-balanced chunks)"
                if layout.cp > 1
                else ""
            ),
        ),
        StepCause(
            "memory_bound",
            per_step * layer.memory_bound_s,
            "norms, residual adds, rotary, activation"
            + (", FP8 casts" if layout.precision == "fp8" else "")
            + " at HBM speed",
        ),
        StepCause("recompute", per_step * layer.recompute_s, f"recompute={layout.recompute}"),
        StepCause(
            "kernel_launch",
            per_step * layer.launch_s,
            "a gap per kernel; the host's time per op where it is slower than the GPU",
        ),
        StepCause("logits", grad_accum * extra, "output projection and cross-entropy"),
        StepCause("tp_comm", step.tp_comm_s, f"sequence-parallel collectives over tp={layout.tp}"),
        StepCause("cp_comm", step.cp_comm_s, "ring transfers not hidden, and output merges"),
        StepCause("bubble", step.bubble_s, f"(pp - 1) / vp = {layout.pp - 1}/{layout.vp}"),
        StepCause("pp_comm", step.pp_comm_s, "activations between pipeline stages"),
        StepCause(
            "dp_comm",
            step.dp_comm_s,
            f"ZeRO-{layout.zero_stage} collectives not hidden, plus their slowdown of compute",
        ),
        StepCause("optimizer", step.optimizer_s, "Adam over the parameters this rank owns"),
    ]


def explain_plan(
    model: ModelShape,
    hardware: str,
    network: str,
    gpus_per_node: int,
    layout: Layout,
    seq_len: int,
    grad_accum: int,
) -> list[StepCause]:
    """`explain_step` from the names a PlanResult carries."""
    chip = hardware_named(hardware)
    fabric = Fabric.of(chip, Network(network), gpus_per_node)
    return explain_step(model, chip, fabric, layout, seq_len, grad_accum)
