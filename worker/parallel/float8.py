"""FP8 training on the linear layers with torchao's float8, where the GPU has FP8 GEMMs.

FP8 tensor cores arrived with compute capability 8.9 (Ada, L40S) and 9.0 (Hopper: H100,
H200); NVIDIA's CUDA C++ Programming Guide lists __nv_fp8 arithmetic from sm_89. Anywhere
else the run is refused before any collective, with DO_NOT_RETRY: another attempt on the
same hardware would fail the same way.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from contract import Float8Scaling
from worker.errors import UnsupportedLayoutError

MIN_FP8_CAPABILITY = (8, 9)  # sm_89 (Ada) and sm_90 (Hopper) have FP8 tensor cores
FP8_ALIGNMENT = 16  # torch._scaled_mm needs both GEMM dimensions divisible by 16


def check_fp8_hardware() -> None:
    """Raise UnsupportedLayoutError unless this rank has a GPU with FP8 GEMMs and torchao."""
    if not torch.cuda.is_available():
        raise UnsupportedLayoutError(
            "precision=fp8 needs an NVIDIA GPU with FP8 tensor cores (compute capability "
            ">= 8.9: H100, H200, L40S), and this worker has no CUDA device; "
            "use precision bf16 (or fp32 on CPU)"
        )
    capability = torch.cuda.get_device_capability()
    if capability < MIN_FP8_CAPABILITY:
        name = torch.cuda.get_device_name()
        raise UnsupportedLayoutError(
            f"precision=fp8 needs compute capability >= 8.9 (H100, H200, L40S), but this "
            f"worker's {name} is {capability[0]}.{capability[1]}; use precision bf16"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError as exc:
        raise UnsupportedLayoutError(
            "precision=fp8 needs torchao on the worker: pip install 'runyard[worker]'"
        ) from exc


def _fp8_eligible(module: nn.Module, fqn: str) -> bool:
    """Linear layers whose GEMMs FP8 can run; the output head stays BF16, as in torchtitan
    and Llama 3: its logits feed the loss directly and are the most range-sensitive."""
    return (
        isinstance(module, nn.Linear)
        and fqn.split(".")[-1] != "output"
        and module.in_features % FP8_ALIGNMENT == 0
        and module.out_features % FP8_ALIGNMENT == 0
    )


def apply_float8(model: nn.Module, scaling: Float8Scaling, emulate: bool = False) -> None:
    """Swap eligible nn.Linear modules for torchao's Float8Linear, in place. Before tensor
    parallel, which then uses torchao's float8-aware styles (tensorwise). `emulate` runs
    the casts without FP8 GEMMs, so tests can exercise this path on a CPU."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(scaling.value)
    if emulate:
        config = dataclasses.replace(config, emulate=True)
    convert_to_float8_training(model, config=config, module_filter_fn=_fp8_eligible)
