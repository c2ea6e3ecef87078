"""A plain PyTorch DDP training script that runs under runyard as it is.

A small byte-level language model (an embedding, a GRU, a linear head) learns to predict
the next byte of Python's own standard library. Everything is ordinary PyTorch: launch it
with torchrun by hand, or name it in a run spec and runyard launches it on every rank:

    entrypoint: {script: examples/ddp_train.py, args: ["--checkpoint-every", "20"]}

The only runyard import is runyard-client (`runyard_client`, which installs alone into the
script's own environment): it says where to resume from, takes the progress and checkpoint
reports, and says when to stop (cancel, preemption, time limit).
"""

from __future__ import annotations

import argparse
import os
import sysconfig
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from runyard_client import connect
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class ByteModel(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, width)
        self.rnn = nn.GRU(width, width, batch_first=True)
        self.head = nn.Linear(width, 256)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.head(hidden)


def corpus() -> torch.Tensor:
    """The bytes of the first standard-library modules: the same on every node."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    data = b"".join(path.read_bytes() for path in sorted(stdlib.glob("*.py"))[:40])
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).long()


def batch(data: torch.Tensor, step: int, rank: int, size: int, seq_len: int) -> torch.Tensor:
    """This rank's sequences for `step`: a function of the step, so a resume sees the same."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    starts = torch.randint(0, len(data) - seq_len - 1, (size,), generator=generator)
    return torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=0, help="default: the run spec's steps")
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per rank")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    session = connect()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # RANK, WORLD_SIZE, MASTER_* from env
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if cuda else "cpu")
    steps = args.steps or session.steps or 100
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    model = DDP(ByteModel(args.width).to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    start = 0
    if session.resume is not None:
        state = torch.load(session.resume.path, map_location=device)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        if rank == 0:
            print(f"resumed from {session.resume.path} at step {start}", flush=True)
    session.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    data = corpus()

    def save(step: int) -> None:
        if rank == 0:
            path = session.checkpoint_dir / f"step_{step:08d}.pt"
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(state | {"step": step}, path.with_suffix(".tmp"))
            os.replace(path.with_suffix(".tmp"), path)  # complete, or not there at all
            session.committed(step, path, num_bytes=path.stat().st_size)
        dist.barrier()

    for step in range(start + 1, steps + 1):
        tokens = batch(data, step, rank, args.batch_size, args.seq_len).to(device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients across ranks here
        optimizer.step()

        # One small all-reduce: the mean loss for the report, and whether any rank must stop.
        shared = torch.tensor([loss.item(), float(session.should_stop)], device=device)
        dist.all_reduce(shared)
        session.report(step, shared[0].item() / world_size, tokens=world_size * tokens.numel())
        stop = shared[1].item() > 0
        if step % args.checkpoint_every == 0 or step == steps or stop:
            save(step)
        if stop:
            if rank == 0:
                print(f"stopping at step {step}: runyard asked to", flush=True)
            break
    else:
        if rank == 0:
            session.finish(steps)
    session.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
