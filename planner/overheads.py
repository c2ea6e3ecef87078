"""Fixed costs per kernel: what dominates when a layer's matrices get small.

Large models hide these: a 70B layer's GEMMs run for milliseconds, and the host queues
kernels far ahead of the GPU. Small models on many GPUs (1B-8B, a micro batch of a few
thousand tokens per rank, tp or cp cutting it further) run kernels of tens of
microseconds, and two fixed costs per kernel start to show:

- On the GPU, consecutive kernels leave a gap while one drains and the next is set up,
  about a microsecond even when the host is ahead (NVIDIA Developer Blog, "Getting
  Started with CUDA Graphs", Gray 2019: a 2.9 us kernel launched back to back on a
  stream took 3.8 us per launch).
- On the host, eager PyTorch spends several microseconds per op (Python, the
  dispatcher, autograd bookkeeping, cudaLaunchKernel); if a layer's kernels finish
  faster than the host can issue them, the GPU waits for the host (PyTorch blog,
  "Accelerating PyTorch with CUDA Graphs", 2021, which removes exactly this cost).

Kernel counts follow a Megatron-LM / Transformer Engine layer: forward runs two norms,
four GEMMs, rotary, the attention kernel, the activation and two residual adds; backward
runs two GEMMs (data and weight gradient) per forward GEMM and one or two kernels per
other op; tensor parallel adds four collectives each way, FP8 a cast per GEMM operand.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_KERNEL_GAP_S = 1e-6  # Gray 2019, above: 3.8 us per launch of a 2.9 us kernel
# Eager PyTorch's host time per op: cudaLaunchKernel alone is ~2-3 us (Gray 2019, above);
# Python, the dispatcher and autograd add a few more. An estimate, not a measurement: it
# only binds when a layer's kernels average under ~8 us, i.e. tiny micro batches.
HOST_OP_S = 8e-6
FORWARD_KERNELS = 11  # 2 norms, 4 GEMMs, rotary, attention, activation, 2 residual adds
BACKWARD_KERNELS = 19  # 8 GEMMs, attention, 2 norms, rotary, activation, adds, grad sums
TP_COLLECTIVES_EACH_WAY = 4  # sequence parallel: 2 all-gathers + 2 reduce-scatters
FP8_CASTS_FORWARD = 4  # one input cast per GEMM (Transformer Engine)
FP8_CASTS_BACKWARD = 4  # one output-gradient cast per GEMM


@dataclass(frozen=True, slots=True)
class KernelCounts:
    """Kernels one layer launches for one micro batch."""

    forward: int
    backward: int


def layer_kernels(tp: int, cp: int, precision: str, recompute: str) -> KernelCounts:
    """How many kernels a layer launches forward and backward under this layout."""
    forward = FORWARD_KERNELS + (TP_COLLECTIVES_EACH_WAY if tp > 1 else 0)
    forward += FP8_CASTS_FORWARD if precision == "fp8" else 0
    # Ring attention calls the kernel once per ring step and merges after each.
    forward += 2 * (cp - 1)
    backward = BACKWARD_KERNELS + (TP_COLLECTIVES_EACH_WAY if tp > 1 else 0)
    backward += FP8_CASTS_BACKWARD if precision == "fp8" else 0
    backward += 2 * (cp - 1)
    if recompute == "full":
        backward += forward
    elif recompute == "selective":
        backward += 3  # the two norms and the activation again
    return KernelCounts(forward, backward)


def with_launch_costs(gpu_s: float, num_kernels: int) -> float:
    """Time of `num_kernels` kernels whose GPU work adds up to `gpu_s`.

    The GPU pays its gap per kernel; the host must issue them all, and the slower of
    host and GPU sets the pace (the host runs ahead whenever the GPU is slower).
    """
    device = gpu_s + num_kernels * GPU_KERNEL_GAP_S
    return max(device, num_kernels * HOST_OP_S)
