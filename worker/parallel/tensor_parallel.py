"""Tensor parallel with sequence parallel (Megatron-LM's layout, on DTensor).

Inside a block, attention heads and the MLP's inner width are split across the tp ranks:
wq/wk/wv and w1/w3 column-wise, wo and w2 row-wise, so each half of a block needs one
collective forward and one backward. Between those halves the activations are sharded along
the sequence (dim 1) instead of replicated: the norms run on 1/tp of the tokens and the
stored activations shrink by tp (Korthikanti et al. 2022, "sequence parallel"). The
embedding is split by vocabulary rows; the output head by vocabulary columns, its logits
gathered so the loss sees the whole vocabulary.
"""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from worker.model import Transformer


def _styles(float8_tensorwise: bool) -> tuple[type, type, type]:
    """Column-wise, row-wise and input-preparing styles; with tensorwise float8, torchao's
    versions, which all-gather activations in FP8 (half the bytes of BF16)."""
    if float8_tensorwise:
        from torchao.float8.float8_tensor_parallel import (  # GPU-only path, imported late
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )

        return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    return ColwiseParallel, RowwiseParallel, PrepareModuleInput


def apply_tensor_parallel(
    model: Transformer, tp_mesh: DeviceMesh, float8_tensorwise: bool = False
) -> None:
    """Shard `model` (a whole model or one pipeline stage) over `tp_mesh`, in place."""
    colwise, rowwise, prepare_input = _styles(float8_tensorwise)
    outer: dict[str, object] = {}
    if model.tok_embeddings is not None:
        # Each rank looks up the token ids in its vocabulary rows; the partial results are
        # reduce-scattered straight into sequence shards.
        outer["tok_embeddings"] = RowwiseParallel(
            input_layouts=Replicate(), output_layouts=Shard(1)
        )
    if model.norm is not None:
        outer["norm"] = SequenceParallel()
    if model.output is not None:
        outer["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
    parallelize_module(model, tp_mesh, outer)  # type: ignore[arg-type]

    for block in model.layers.values():
        plan: dict[str, object] = {
            "attention_norm": SequenceParallel(),
            # Gather the sequence shards before the projections: attention needs every token.
            # The RoPE tables (args 2 and 3) are plain tensors and pass through untouched.
            "attention": prepare_input(
                input_layouts=(Shard(1), None, None),
                desired_input_layouts=(Replicate(), None, None),
            ),
            "attention.wq": colwise(),
            "attention.wk": colwise(),
            "attention.wv": colwise(),
            "attention.wo": rowwise(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": prepare_input(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            ),
            "feed_forward.w1": colwise(),
            "feed_forward.w3": colwise(),
            "feed_forward.w2": rowwise(output_layouts=Shard(1)),
        }
        parallelize_module(block, tp_mesh, plan)  # type: ignore[arg-type]
