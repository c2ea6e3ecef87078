"""Time of one optimizer step under a layout, term by term.

The model, and the few efficiency assumptions it rests on:
- GEMMs run at the roofline of their shape: the slower of FLOPs at `gemm_efficiency` of
  peak (a hardware preset, from large-GEMM measurements), charged for tile and wave
  quantization and each tile's fixed prologue/epilogue, and operand bytes at
  HBM_EFFICIENCY of memory bandwidth; so thin matrices (large tp, small micro batches)
  lose speed the way they do on the device. Backward is two GEMMs of the same size.
- FSDP copies gathered weights out and gradients in, through HBM, every micro batch.
- Fused causal attention runs at its kernel's published speed for its key count and
  head width, forward and backward apart; the preset names the kernel (`attention.py`).
- Norms, residual adds, rotary, the MLP activation, FP8 casts and the loss are memory
  bound: bytes moved / (HBM_EFFICIENCY x bandwidth).
- Tensor-parallel collectives (sequence parallel: two all-gathers and two reduce-scatters
  per layer each way) are not overlapped, as in Megatron-LM's default.
- Context-parallel ring transfers hide behind the attention they feed when the link keeps
  up; merging each ring step's partial output is memory bound (`attention.py`).
- Every kernel pays a launch gap, and the host must keep up (`overheads.py`).
- Data-parallel / FSDP collectives hide behind the compute of the window they can overlap
  (see `_data_parallel_s`), and slow that compute by OVERLAP_SLOWDOWN of their length,
  since NCCL kernels take SMs and HBM bandwidth from the GEMMs they run beside.
- The pipeline bubble is (pp - 1) / vp micro-batch times (Narayanan et al. 2021).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from contract import ModelShape

from .attention import attention_time
from .collectives import Fabric
from .hardware import HBM_EFFICIENCY, Hardware
from .layout import Layout
from .memory import stage_params
from .overheads import layer_kernels, with_launch_costs
from .transformer import (
    elementwise_bytes_per_token,
    every_second_matmul,
    fp8_cast_bytes_per_token,
    layer_gemm_shapes,
)

# cuBLAS/CUTLASS's large-GEMM tile on Ampere and Hopper is 128 x 256 outputs per SM.
TILE_M, TILE_N = 128, 256
# A tile's prologue (filling the load pipeline) and epilogue (writing 64 KB of BF16
# output) cost about as much as four 64-deep steps of its BF16 main loop. They take the
# same time whatever the inputs' precision, so against FP8's twice-as-fast main loop they
# are worth twice the reduction depth (see `gemm_s`).
TILE_FIXED_K = 256
ELEMENTWISE_BACKWARD_RATIO = 2.0  # backward reads the saved input and the gradient, writes one
OVERLAP_SLOWDOWN = 0.1  # share of an overlapped collective's time that still slows compute
# Adam's update streams the FP32 master weight, m and v in and out (24 bytes), reads the
# gradient (2) and writes the BF16 weight (2) for every parameter it owns.
OPTIMIZER_BYTES_MOVED = 28
# FSDP (ZeRO-3) copies every gathered weight out of the all-gather buffer in forward and
# again in backward (read 2 + write 2 bytes each), and every gradient into the
# reduce-scatter buffer (read 2 + write 2): PyTorch FSDP2 design, copy-in / copy-out.
ZERO3_COPY_BYTES_PER_PARAM = 12
LOSS_BYTES_PYTORCH = 4.0 * 4  # per logit: FP32, ~4 passes (see `logits_s`)
LOSS_BYTES_FUSED = 2.0 + 2 * 2  # per logit: BF16 read forward, read + write backward


@dataclass(frozen=True, slots=True)
class StepScale:
    """Per-cluster corrections of the model's two kinds of terms, fitted from the cluster's
    own measured runs (`calibration.py`); 1.0 is the published-figure model.

    compute: everything a GPU does on its own (GEMMs, attention, memory-bound ops, launch
    gaps, the optimizer); communication: every collective and point-to-point transfer
    (tensor-, context-, pipeline- and data-parallel), before overlap is worked out.
    """

    compute: float = 1.0
    communication: float = 1.0


UNSCALED = StepScale()


@dataclass(frozen=True, slots=True)
class StepTime:
    """Seconds of one optimizer step on the busiest rank, by cause."""

    compute_s: float  # GEMMs, attention, memory-bound ops, recompute: all micro batches
    tp_comm_s: float
    cp_comm_s: float  # the part not hidden behind attention
    bubble_s: float
    pp_comm_s: float
    dp_comm_s: float  # the part not hidden behind compute, plus overlap slowdown
    optimizer_s: float

    @property
    def total_s(self) -> float:
        return (
            self.compute_s
            + self.tp_comm_s
            + self.cp_comm_s
            + self.bubble_s
            + self.pp_comm_s
            + self.dp_comm_s
            + self.optimizer_s
        )


@dataclass(frozen=True, slots=True)
class LayerTime:
    """One layer, one micro batch, one rank: forward, backward and their parts."""

    forward_s: float  # compute only
    backward_s: float  # compute only, including any recomputed forward
    tp_comm_s: float
    cp_comm_s: float
    # forward_s + backward_s by cause, for `runyard plan --explain`
    gemm_s: float
    attention_s: float
    memory_bound_s: float  # norms, residuals, rotary, activation, FP8 casts
    recompute_s: float
    launch_s: float  # per-kernel gaps, or the host when it is slower than the GPU

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s + self.tp_comm_s + self.cp_comm_s


def gemm_s(m: int, k: int, n: int, hardware: Hardware, precision: str) -> float:
    """Time of one (m x k) @ (k x n) product with a BF16 output.

    The compute side pays for whole output tiles (tile quantization), for a partly idle
    last wave of tiles (on average half a wave, as tile counts fall at random against the
    SM count), and for each tile's fixed prologue and epilogue, worth TILE_FIXED_K of
    reduction depth (NVIDIA, Matrix Multiplication Background User's Guide: tile and wave
    quantization). The fixed part is a time, so it is worth more depth when the main loop
    runs faster (FP8). The memory side is the roofline of the operand bytes.
    """
    operand_bytes = 1 if precision == "fp8" else 2
    tiles_m, tiles_n = -(-m // TILE_M), -(-n // TILE_N)
    waves = tiles_m * tiles_n / hardware.num_sms
    fixed_k = TILE_FIXED_K * hardware.peak_flops(precision) / hardware.peak_bf16_flops
    padded_flops = 2.0 * tiles_m * TILE_M * tiles_n * TILE_N * (k + fixed_k)
    compute = padded_flops * (waves + 0.5) / waves
    compute /= hardware.gemm_efficiency * hardware.peak_flops(precision)
    moved = operand_bytes * (m * k + k * n) + 2.0 * m * n
    return max(compute, moved / (HBM_EFFICIENCY * hardware.hbm_bytes_per_s))


@lru_cache(maxsize=65536)
def layer_time(
    model: ModelShape,
    hardware: Hardware,
    fabric: Fabric,
    precision: str,
    tp: int,
    cp: int,
    tokens: int,
    seq_len: int,
    recompute: str,
) -> LayerTime:
    """Cost of one layer for `tokens` local tokens (micro batch x seq / cp) on one rank."""
    hbm = HBM_EFFICIENCY * hardware.hbm_bytes_per_s
    gemms = sum(
        gemm_s(m, k, n, hardware, precision) for m, k, n in layer_gemm_shapes(model, tokens, tp)
    )
    attention = attention_time(model, hardware, fabric, tp, cp, tokens, seq_len)
    elementwise = tokens / tp * elementwise_bytes_per_token(model) / hbm
    casts = tokens / tp * fp8_cast_bytes_per_token(model) / hbm if precision == "fp8" else 0.0
    memory_bound = (1 + ELEMENTWISE_BACKWARD_RATIO) * elementwise + casts
    forward = gemms + attention.forward_s + elementwise + casts / 2
    backward = (
        2 * gemms + attention.backward_s + ELEMENTWISE_BACKWARD_RATIO * elementwise + casts / 2
    )
    # Sequence parallel: all-gather before QKV and MLP-up, reduce-scatter after the output
    # projection and MLP-down, each over the full local activation (tokens x hidden).
    activation = 2.0 * tokens * model.hidden
    tp_one_way = 4 * fabric.collective_s(activation, tp, 1, passes=1)
    tp_comm = 2 * tp_one_way
    recomputed = 0.0
    if recompute == "full":
        recomputed = forward
        tp_comm += tp_one_way
    elif recompute == "selective":
        recomputed = tokens / tp * elementwise_bytes_per_token(model, recompute_only=True) / hbm
        if hardware.selective_reruns_every_second_matmul:
            recomputed += sum(
                gemm_s(m, k, n, hardware, precision)
                for m, k, n in every_second_matmul(model, tokens, tp)
            )
    backward += recomputed
    kernels = layer_kernels(tp, cp, precision, recompute)
    device = forward + backward
    forward = with_launch_costs(forward, kernels.forward)
    backward = with_launch_costs(backward, kernels.backward)
    cp_comm = attention.cp_exposed_s + attention.cp_merge_s
    if recompute == "full":  # the recomputed forward merges its ring steps again
        cp_comm += attention.cp_merge_forward_s + attention.cp_exposed_forward_s
    return LayerTime(
        forward,
        backward,
        tp_comm,
        cp_comm,
        gemm_s=3 * gemms,
        attention_s=attention.forward_s + attention.backward_s,
        memory_bound_s=memory_bound,
        recompute_s=recomputed,
        launch_s=forward + backward - device,
    )


def busiest_stage(
    model: ModelShape, layout: Layout, layer: LayerTime, logits: float
) -> tuple[float, float]:
    """(layers, extra seconds of logits) the slowest pipeline stage runs per micro batch.

    With several stages a balancer moves layers off the last one to make room for the
    logits, but no stage can carry less than the average (Llama 3 paper, 3.3.2).
    """
    busiest = layout.stage_layers(model.layers)
    average = model.layers / layout.pp
    if layout.pp == 1:
        return float(model.layers), logits
    if busiest * layer.total_s >= average * layer.total_s + logits:
        return float(busiest), 0.0
    return average, logits


def logits_s(model: ModelShape, hardware: Hardware, layout: Layout, tokens: int) -> float:
    """Output projection forward and backward plus the cross-entropy passes over logits.

    The projection stays in BF16 under FP8 recipes: Megatron-LM builds it as a plain
    ColumnParallelLinear outside Transformer Engine's FP8 layers, and torchtitan's float8
    conversion skips the "output" module by default.
    """
    # The projection computes the padded vocabulary's logits (`ModelShape.padded_vocab`).
    gemm = gemm_s(tokens, model.hidden, model.padded_vocab // layout.tp, hardware, "bf16")
    # PyTorch's loss makes ~4 FP32 passes over the logits (cast, log-softmax, its
    # backward, the cast back); a fused cross-entropy reads the BF16 logits forward and
    # reads and overwrites them with their gradient backward (flash-attn's xentropy).
    per_logit = LOSS_BYTES_FUSED if hardware.fused_loss else LOSS_BYTES_PYTORCH
    loss_bytes = per_logit * tokens * model.padded_vocab / layout.tp
    return 3 * gemm + loss_bytes / (HBM_EFFICIENCY * hardware.hbm_bytes_per_s)


def _data_parallel_s(
    fabric: Fabric,
    layout: Layout,
    num_bytes: float,
    grad_accum: int,
    forward_s: float,
    backward_s: float,
    num_layers: int,
    communication: float = 1.0,
) -> float:
    """Exposed data-parallel time per step, and the slowdown of what it overlaps.

    ZeRO-0 all-reduces and ZeRO-1 reduce-scatters gradients once per step, behind the
    last micro batch's backward; ZeRO-1/2 gather updated weights behind the next step's
    first forward; ZeRO-2 must reduce-scatter after every micro batch; ZeRO-3 gathers
    weights before each forward and backward and reduce-scatters after, every micro
    batch, and cannot hide the first layer's gather.
    """
    size, stride = layout.dp * layout.cp, layout.tp
    gather = communication * fabric.collective_s(num_bytes, size, stride, passes=1)
    if size <= 1:
        return 0.0
    windows: list[tuple[float, float]]  # (collective time, compute it may hide behind)
    if layout.zero_stage == 0:
        windows = [(2 * gather, backward_s)]
    elif layout.zero_stage == 1:
        windows = [(gather, backward_s), (gather, forward_s)]
    elif layout.zero_stage == 2:
        windows = [(gather, backward_s)] * grad_accum + [(gather, forward_s)]
    else:
        per_micro_batch = [(gather, forward_s), (2 * gather, backward_s)]
        windows = per_micro_batch * grad_accum + [(gather / num_layers, 0.0)]
    exposed = sum(max(0.0, comm - window) for comm, window in windows)
    overlapped = sum(min(comm, window) for comm, window in windows)
    return exposed + OVERLAP_SLOWDOWN * overlapped


@dataclass(frozen=True, slots=True)
class StepParts:
    """A step's time and the per-layer terms it was built from (`runyard plan --explain`)."""

    step: StepTime
    layer: LayerTime  # one layer, one micro batch, on the busiest rank
    stage_layers: float  # layers the busiest stage runs per micro batch
    logits_s: float  # output projection and loss per micro batch, where that stage runs it
    tokens: int  # local tokens per micro batch (micro batch x seq / cp)


def estimate_step(
    model: ModelShape,
    hardware: Hardware,
    fabric: Fabric,
    layout: Layout,
    seq_len: int,
    grad_accum: int,
    scale: StepScale = UNSCALED,
) -> StepTime:
    """The step time of `layout` for a global batch of grad_accum x dp micro batches."""
    return step_parts(model, hardware, fabric, layout, seq_len, grad_accum, scale).step


def step_terms_s(
    model: ModelShape,
    hardware: Hardware,
    fabric: Fabric,
    layout: Layout,
    seq_len: int,
    grad_accum: int,
) -> tuple[float, float]:
    """(compute, communication): how much of the unscaled step time each kind of term
    accounts for, overlap included, so that they add up to the step time.

    Every term scales with one of the two factors of StepScale and the overlaps are
    max(0, a - b) of such terms, so the step time is homogeneous of degree one in them and
    equals compute x dT/dcompute + communication x dT/dcommunication (Euler); each part is
    that derivative at (1, 1), taken numerically. These are what a calibration fits its
    factors against (`calibration.py`)."""
    h = 1e-3

    def total(compute: float, communication: float) -> float:
        scale = StepScale(compute, communication)
        return estimate_step(model, hardware, fabric, layout, seq_len, grad_accum, scale).total_s

    compute = (total(1 + h, 1.0) - total(1 - h, 1.0)) / (2 * h)
    return compute, total(1.0, 1.0) - compute


def step_parts(
    model: ModelShape,
    hardware: Hardware,
    fabric: Fabric,
    layout: Layout,
    seq_len: int,
    grad_accum: int,
    scale: StepScale = UNSCALED,
) -> StepParts:
    """`estimate_step` with the per-layer terms it adds up, for callers that show them."""
    tokens = layout.micro_batch_size * seq_len // layout.cp
    layer = layer_time(
        model,
        hardware,
        fabric,
        layout.precision,
        layout.tp,
        layout.cp,
        tokens,
        seq_len,
        layout.recompute,
    )
    logits = logits_s(model, hardware, layout, tokens)
    busiest = layout.stage_layers(model.layers)
    stage_layers, stage_extra = busiest_stage(model, layout, layer, logits)
    # A calibration's factors (StepScale) multiply each term by its kind; 1.0 by default.
    compute, communication = scale.compute, scale.communication
    compute_mb = compute * (stage_layers * (layer.forward_s + layer.backward_s) + stage_extra)
    tp_mb = communication * stage_layers * layer.tp_comm_s
    cp_mb = communication * stage_layers * layer.cp_comm_s
    stage_mb = compute_mb + tp_mb + cp_mb
    bubble = (layout.pp - 1) / layout.vp * stage_mb
    pp_comm = 0.0
    if layout.pp > 1:
        message = 2.0 * tokens * model.hidden / layout.tp  # scattered across tp ranks
        hop = fabric.p2p_s(message, layout.tp * layout.cp * layout.dp)
        pp_comm = communication * 2 * (layout.pp * layout.vp - 1) * hop
    params = stage_params(model, layout)
    dp_comm = _data_parallel_s(
        fabric,
        layout,
        2.0 * params,
        grad_accum,
        forward_s=compute * stage_layers * layer.forward_s,
        backward_s=compute * stage_layers * layer.backward_s,
        num_layers=max(1, busiest),
        communication=communication,
    )
    hbm = HBM_EFFICIENCY * hardware.hbm_bytes_per_s
    if layout.zero_stage == 3 and layout.dp * layout.cp > 1:
        copies = grad_accum * params * ZERO3_COPY_BYTES_PER_PARAM
        dp_comm += compute * copies / hbm
    owned = params / (layout.dp * layout.cp if layout.zero_stage >= 1 else 1)
    optimizer = compute * owned * OPTIMIZER_BYTES_MOVED / hbm
    step = StepTime(
        compute_s=grad_accum * compute_mb,
        tp_comm_s=grad_accum * tp_mb,
        cp_comm_s=grad_accum * cp_mb,
        bubble_s=bubble,
        pp_comm_s=pp_comm,
        dp_comm_s=dp_comm,
        optimizer_s=optimizer,
    )
    return StepParts(step, layer, stage_layers, stage_extra, tokens)
