"""A rank's own part of a parameter or gradient, and the raw bits of its values.

Light on purpose (torch only): the fault hooks, which worker/checkpoint.py imports, use it as
well as the SDC check (worker/sdc.py) and the replica-group loop (worker/fault_tolerance.py).
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

# The integer type of each float type's width: a tensor viewed as it shows its raw bits.
INT_VIEWS = {
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float64: torch.int64,
}


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a parameter or gradient: a DTensor's local shard, else itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
