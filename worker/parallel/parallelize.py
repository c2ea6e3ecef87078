"""Apply a layout to the model: build this rank's part of it, parallelised and initialised.

parallelize_llama() wraps one model (or one pipeline stage) in torchtitan's fixed order:
float8 linears, tensor parallel, context parallel, activation checkpointing, compile, data
parallel. Each step needs the previous one's modules: tensor parallel shards the linears
float8 created; checkpointing wraps blocks whose attention context parallel already
swapped; compile traces the checkpointed block; FSDP groups and hooks the final modules.
The model is built on the meta device and its weights initialised only after all of that,
so no rank ever holds more than its own shards.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from contract import Float8Scaling, ParallelLayout, Precision, WorkerRunConfig
from worker.hf.load import load_hf_weights
from worker.model import Transformer
from worker.parallel.activation_checkpoint import apply_activation_checkpointing, apply_compile
from worker.parallel.context_parallel import apply_context_parallel
from worker.parallel.data_parallel import apply_data_parallel
from worker.parallel.float8 import apply_float8, check_fp8_hardware
from worker.parallel.parallel_dims import ParallelDims
from worker.parallel.pipeline import build_schedule, split_model
from worker.parallel.tensor_parallel import apply_tensor_parallel

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import _PipelineSchedule


def check_supported(layout: ParallelLayout) -> None:
    """Raise UnsupportedLayoutError, naming the field, for what this rank's hardware cannot
    run. The rest of the contract is checked by WorkerRunConfig itself (layout_problems)."""
    if layout.precision is Precision.FP8:
        check_fp8_hardware()


def parallelize_llama(
    model: Transformer, dims: ParallelDims, layout: ParallelLayout, seq_len: int
) -> None:
    """Apply the layout to `model` (the whole model or one pipeline stage) in place."""
    # 1. Float8: swap nn.Linear for torchao's Float8Linear before anything wraps them.
    if layout.precision is Precision.FP8:
        apply_float8(model, layout.fp8_scaling)
    # 2. Tensor parallel (with sequence parallel): shard heads, MLP width and vocabulary.
    if dims.tp > 1:
        float8_tensorwise = (
            layout.precision is Precision.FP8 and layout.fp8_scaling is Float8Scaling.TENSORWISE
        )
        apply_tensor_parallel(model, dims.mesh("tp"), float8_tensorwise)
    # 3. Context parallel: not a wrapper; attention gathers K/V, RoPE takes global positions.
    if dims.cp > 1:
        apply_context_parallel(model, dims.mesh("cp"), seq_len)
    # 4. Activation checkpointing, per block.
    apply_activation_checkpointing(model, layout.recompute)
    # 5. torch.compile, per block, after checkpointing so recomputation is compiled too.
    if layout.compile:
        apply_compile(model)
    # 6. Data parallel last: replicate (DDP) or fully_shard (ZeRO-1/2/3) the final modules.
    #    One rank's worth of dp x cp needs none (and bf16 then comes from autocast).
    if dims.batch_degree > 1:
        apply_data_parallel(model, dims.mesh("dp_cp"), layout)


@dataclass
class TrainingModel:
    """This rank's model: one part, or several pipeline stages and their schedule."""

    parts: list[Transformer]
    schedule: _PipelineSchedule | None  # None without pipeline parallel
    has_first_stage: bool  # takes token ids
    has_last_stage: bool  # produces logits and the loss
    autocast: Callable[[], AbstractContextManager[object]]
    # Every part's parameters, listed once: the modules are parallelized before this is
    # built and keep their parameters from then on (FSDP's sharded ones outside a step;
    # a checkpoint loads into them in place). Listing them walks every module: ~0.3 ms a
    # step on the overhead bench's small model, a third of the loop's cost over a plain one.
    listed: list[torch.nn.Parameter] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.listed = [p for part in self.parts for p in part.parameters()]

    def parameters(self) -> list[torch.nn.Parameter]:
        return self.listed


def build_training_model(
    config: WorkerRunConfig,
    dims: ParallelDims,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> TrainingModel:
    """Build, parallelise and initialise this rank's part of the model (dims' meshes built)."""
    layout = config.layout
    with torch.device("meta"):
        whole = Transformer(config.model, max_seq_len=config.seq_len)
    pp_rank = dims.mesh("pp").get_local_rank()
    parts = split_model(whole, pp_rank, layout) if dims.pp > 1 else [whole]
    for part in parts:
        parallelize_llama(part, dims, layout, config.seq_len)
        part.to_empty(device=device)
        if config.init_from_hf and config.resume_from is None:
            load_hf_weights(part, Path(config.init_from_hf))  # each rank: only its shards
        else:
            part.init_weights(config.seed)  # each rank writes only its shards of the weights
    schedule = None
    if dims.pp > 1:
        schedule = build_schedule(
            parts, dims.mesh("pp"), layout, config.grad_accum, device, loss_fn
        )
    # With data parallel, FSDP's mixed-precision policy casts; without it, autocast does.
    use_autocast = layout.precision is not Precision.FP32 and dims.batch_degree == 1

    def autocast() -> AbstractContextManager[object]:
        if use_autocast:
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return nullcontext()

    return TrainingModel(
        parts=parts,
        schedule=schedule,
        has_first_stage=parts[0].tok_embeddings is not None,
        has_last_stage=parts[-1].output is not None,
        autocast=autocast,
    )
