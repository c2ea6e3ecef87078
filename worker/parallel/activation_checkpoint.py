"""Activation checkpointing per transformer block: recompute instead of storing.

`full` keeps only each block's input and reruns the whole block in backward (about a third
more compute). `selective` keeps every matmul and attention output and the results of
collectives, and recomputes the cheap elementwise work between them (norms, RoPE, SiLU,
the SwiGLU product): most of the memory of `full` is saved for a few percent of the time.
This is the split the planner's memory model assumes (planner/memory.py).
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from contract import Recompute
from worker.model import Transformer

_aten, _c10d = torch.ops.aten, torch.ops._c10d_functional

# Ops whose outputs `selective` keeps. Everything else in a block is recomputed.
SAVED_OPS = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten._scaled_mm.default,  # float8 GEMMs
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    # Re-running a collective in backward would cost the network time again.
    _c10d.reduce_scatter_tensor.default,
    _c10d.all_gather_into_tensor.default,
}


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: Transformer, recompute: Recompute) -> None:
    """Wrap every block of `model` for `recompute` (a no-op for Recompute.NONE)."""
    if recompute is Recompute.NONE:
        return
    context_fn = (
        partial(create_selective_checkpoint_contexts, _selective_policy)
        if recompute is Recompute.SELECTIVE
        else None
    )
    for key, block in list(model.layers.items()):
        # preserve_rng_state=False: the model has no dropout, so the recomputation draws no
        # random numbers and saving the RNG state per block would be wasted work.
        wrapped = (
            checkpoint_wrapper(block, preserve_rng_state=False, context_fn=context_fn)
            if context_fn is not None
            else checkpoint_wrapper(block, preserve_rng_state=False)
        )
        model.layers.register_module(key, wrapped)


def apply_compile(model: Transformer) -> None:
    """torch.compile each block separately: blocks are identical, so one compiled graph
    serves them all, and FSDP's per-block hooks stay outside the compiled code. (The
    `_orig_mod.` this adds to parameter names is stripped by DCP's state dicts and by
    model.canonical_name.) RUNYARD_COMPILE_BACKEND overrides inductor, for debugging and
    for tests: "aot_eager" traces forward and backward the same way without generating
    kernels, which takes seconds instead of most of a minute on a CPU."""
    backend = os.environ.get("RUNYARD_COMPILE_BACKEND", "inductor")
    for key, block in list(model.layers.items()):
        compiled = torch.compile(block, backend=backend)  # an OptimizedModule
        model.layers.register_module(key, compiled)  # type: ignore[arg-type]
