"""A `transformers.Trainer` script that runs under runyard with one callback.

A tiny Llama (2 layers, hidden 64, built from a LlamaConfig: nothing is downloaded) learns
to predict the next byte of Python's own standard library. Everything is the Trainer's own:
it runs DDP over gloo (or NCCL on GPUs) from the launcher's RANK / WORLD_SIZE / MASTER_*,
saves `checkpoint-N` folders every `--save-steps`, and resumes from one. runyard adds one
callback, named where the Trainer asks for it:

    runyard = RunyardCallback()
    args = TrainingArguments(output_dir=runyard.output_dir, ...)       # the run's folder
    trainer = Trainer(model, args, train_dataset=data, callbacks=[runyard])
    trainer.train(resume_from_checkpoint=runyard.resume_from_checkpoint())

Under runyard, a run spec names it (the path as the nodes see it):

    entrypoint: {script: /shared/code/examples/hf_trainer.py, args: ["--save-steps", "20"]}

Standalone: `python examples/hf_trainer.py --steps 50` (checkpoints in ./checkpoints, or
$RUNYARD_CHECKPOINT_DIR; reports to $RUNYARD_METRICS_FILE if set).
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

import torch
from runyard_client.integrations.hf import RunyardCallback
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

VOCAB = 256  # bytes


def tiny_llama(seq_len: int, seed: int = 0, hidden: int = 64, layers: int = 2) -> LlamaForCausalLM:
    """The same initial weights on every rank and in every attempt (the Trainer's DDP
    broadcasts rank 0's anyway; a resume loads the checkpoint's). `hidden` and `layers`:
    larger for bench/callback_overhead.py."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 11 // 4,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=seq_len,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def stdlib_bytes(num_modules: int = 40) -> torch.Tensor:
    """The bytes of the first standard-library modules: the same on every node."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join(path.read_bytes() for path in sorted(stdlib.glob("*.py"))[:num_modules])
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


class ByteSequences(Dataset[dict[str, torch.Tensor]]):
    """`num_sequences` windows of `seq_len` bytes spread evenly over the corpus; the model
    shifts the labels itself. Map-style, so the Trainer's seeded sampler and its skipping of
    trained batches on resume give every step the same batch in every attempt."""

    def __init__(self, data: torch.Tensor, seq_len: int, num_sequences: int = 4096) -> None:
        self.data, self.seq_len = data, seq_len
        self.stride = (len(data) - seq_len) // num_sequences
        self.num_sequences = num_sequences

    def __len__(self) -> int:
        return self.num_sequences

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        window = self.data[index * self.stride : index * self.stride + self.seq_len]
        return {"input_ids": window, "labels": window}


def training_arguments(
    output_dir: str, steps: int, save_steps: int, batch_size: int, lr: float
) -> TrainingArguments:
    return TrainingArguments(
        output_dir=output_dir,  # runyard.output_dir: checkpoint-N folders in the run's folder
        max_steps=steps,
        save_steps=save_steps,
        save_total_limit=3,  # the Trainer prunes; runyard resumes from the newest commit
        logging_steps=1,  # runyard sees the steps the Trainer logs
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        warmup_steps=min(10, steps // 10),
        lr_scheduler_type="cosine",
        weight_decay=0.01,
        seed=0,
        use_cpu=not torch.cuda.is_available(),  # DDP over gloo on CPUs, from WORLD_SIZE
        dataloader_num_workers=0,
        report_to="none",
        disable_tqdm=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="default: the run spec's steps")
    parser.add_argument("--save-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    runyard = RunyardCallback()
    steps = args.steps or runyard.session.steps or 200
    trainer = Trainer(
        model=tiny_llama(args.seq_len),
        args=training_arguments(
            runyard.output_dir, steps, args.save_steps, args.batch_size, args.lr
        ),
        train_dataset=ByteSequences(stdlib_bytes(), args.seq_len),
        callbacks=[runyard],
    )
    resume = runyard.resume_from_checkpoint()
    if resume is not None and runyard.session.is_rank0:
        print(f"resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
