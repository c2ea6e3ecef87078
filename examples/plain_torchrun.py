"""A plain torchrun script that knows nothing of runyard, and runs under it unchanged.

Plain PyTorch: torch.distributed (gloo on CPU, NCCL on GPUs), DDP, and checkpoints saved
with torch.distributed.checkpoint (DCP) into `step-N` folders, the layout torchtitan uses.
It prints `step N loss X` on rank 0, saves into --save-dir and resumes from --resume:

    torchrun --nproc-per-node 2 examples/plain_torchrun.py --steps 100 --save-dir /tmp/ckpt

Under runyard, the run spec says how to read it, and nothing in here changes:

    entrypoint: {script: examples/plain_torchrun.py, args: ["--steps", "100"]}
    progress: {pattern: 'step (?P<step>\\d+) loss (?P<loss>\\S+)'}
    resume: {save_flag: --save-dir, flag: --resume}

runyard appends `--save-dir <the run's checkpoint folder>`, and `--resume <its newest
committed checkpoint>` after a failure; it reads the step lines for `run watch`, goodput
and hang detection, and commits each `step-N` folder once DCP's `.metadata` is in it.
`--steps` must be the spec's `steps`, and the last step saved, for the run to succeed.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel as DDP


def batch(step: int, rank: int, size: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's inputs and targets for `step`: a function of the step, so a resumed run
    trains on exactly what it would have; the targets a fixed linear map of the inputs."""
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    inputs = torch.randn(size, width, generator=generator)
    truth = torch.Generator().manual_seed(7)
    weights = torch.randn(width, width, generator=truth) / width**0.5
    return inputs, inputs @ weights


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--save-dir", type=Path, default=Path("checkpoints"))
    parser.add_argument("--resume", type=Path, default=None, help="a step-N folder")
    parser.add_argument("--batch-size", type=int, default=16, help="samples per rank")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--pace-s", type=float, default=0.0, help="sleep per step (to watch)")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # RANK, WORLD_SIZE, MASTER_* from env
    rank, world_size = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{int(os.environ['LOCAL_RANK'])}" if cuda else "cpu")
    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts them)
    width = args.width
    model = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width))
    model = DDP(model.to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    start = 0
    if args.resume is not None:
        named = re.fullmatch(r"step-(\d+)", args.resume.name)
        if named is None:
            parser.error(f"--resume {args.resume}: not a step-N folder")
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=args.resume)  # every rank reads its part
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])  # fmt: skip
        start = int(named.group(1))
        if rank == 0:
            print(f"resumed from {args.resume} at step {start}", flush=True)

    def save(step: int) -> None:
        # DCP writes every rank's part, then .metadata on rank 0: the folder is complete
        # once that file is there (what runyard, and torchtitan itself, rely on).
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state},
                 checkpoint_id=args.save_dir / f"step-{step}")  # fmt: skip

    for step in range(start + 1, args.steps + 1):
        inputs, targets = (t.to(device) for t in batch(step, rank, args.batch_size, width))
        loss = F.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients across ranks here
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the loss of the whole batch, for the log line
        if rank == 0:
            print(f"step {step} loss {mean.item() / world_size:.6f}", flush=True)
        if step % args.checkpoint_every == 0 or step == args.steps:
            save(step)
        time.sleep(args.pace_s)  # a tiny model on CPUs trains faster than anyone can watch
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
