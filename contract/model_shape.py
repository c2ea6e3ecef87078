"""The model's architecture as both sides see it: a dense Llama-style decoder."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from ._frozen import Frozen

# Megatron-LM pads the embedding and output layers to a multiple of
# make_vocab_size_divisible_by (default 128) times tp, so that tensor parallel divides them
# and the output GEMM keeps tensor-core-friendly tiles. We pad once for every tp a node of
# eight GPUs allows (1, 2, 4, 8: the brief's nodes, DGX H100), 128 x 8, so that a
# checkpoint's shapes do not depend on the layout and a run resumes at another tp.
VOCAB_PAD_MULTIPLE = 128 * 8
MAX_NODE_TENSOR_PARALLEL = 8


class ModelShape(Frozen):
    """A dense Llama-style decoder."""

    layers: int = Field(ge=1, le=1024, description="Transformer blocks.")
    hidden: int = Field(ge=8, le=65536, description="Model width (d_model).")
    heads: int = Field(ge=1, le=1024, description="Query heads.")
    kv_heads: int = Field(ge=1, le=1024, description="Key/value heads (GQA groups).")
    ffn: int = Field(ge=8, le=262144, description="MLP inner width.")
    vocab: int = Field(ge=2, le=1_048_576, description="Vocabulary size.")
    mlp: Literal["swiglu", "gelu"] = Field(
        default="swiglu", description="swiglu: gate/up/down (3 matrices); gelu: up/down (2)."
    )
    rope_theta: float = Field(default=500_000.0, gt=0, description="RoPE base frequency.")
    norm_eps: float = Field(default=1e-5, gt=0, description="RMSNorm epsilon.")

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelShape:
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(
                f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def padded_vocab(self) -> int:
        """Rows of the embedding and the output layer. A vocabulary every tp inside a node
        divides is kept as it is; any other (GPT-2's 50,257) is padded to the next multiple
        of VOCAB_PAD_MULTIPLE. The padded rows are never a token: the logits and the loss
        leave them out (worker/model.py), and the Hugging Face export drops them."""
        if self.vocab % MAX_NODE_TENSOR_PARALLEL == 0:
            return self.vocab
        return -(-self.vocab // VOCAB_PAD_MULTIPLE) * VOCAB_PAD_MULTIPLE

    @property
    def num_params(self) -> int:
        """Parameter count (untied input and output embeddings)."""
        kv_dim = self.kv_heads * self.head_dim
        attention = self.hidden * (self.hidden + 2 * kv_dim) + self.hidden * self.hidden
        mlp = (3 if self.mlp == "swiglu" else 2) * self.hidden * self.ffn
        norms = 2 * self.hidden
        return self.layers * (attention + mlp + norms) + 2 * self.vocab * self.hidden + self.hidden
