"""Model shapes the run spec and the planner know by name."""

from __future__ import annotations

from contract import ModelShape

# Llama 3 family shapes from Meta's published model cards / params.json files
# (Llama 3.2 1B and 3B, Llama 3.1 8B, 70B and 405B).
LLAMA3_VOCAB = 128_256
MODEL_PRESETS: dict[str, ModelShape] = {
    # Small enough to train on 2 CPU cores in well under a second per step.
    "tiny": ModelShape(layers=2, hidden=128, heads=4, kv_heads=2, ffn=384, vocab=256),
    "llama3-1b": ModelShape(
        layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=LLAMA3_VOCAB
    ),
    "llama3-3b": ModelShape(
        layers=28, hidden=3072, heads=24, kv_heads=8, ffn=8192, vocab=LLAMA3_VOCAB
    ),
    "llama3-8b": ModelShape(
        layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=LLAMA3_VOCAB
    ),
    "llama3-70b": ModelShape(
        layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=LLAMA3_VOCAB
    ),
    "llama3-405b": ModelShape(
        layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=LLAMA3_VOCAB
    ),
    # Brown et al. 2020 (Language Models are Few-Shot Learners), Table 2.1: 96 layers,
    # d_model 12288, 96 heads, d_ff = 4 x d_model; GPT-2 BPE vocabulary (50,257 tokens).
    "gpt3-175b": ModelShape(
        layers=96, hidden=12288, heads=96, kv_heads=96, ffn=49152, vocab=50257, mlp="gelu"
    ),
}
