"""One optimizer step's forward and backward passes, whatever the layout.

Without a pipeline, the rank runs its micro batches one after another and accumulates
gradients, telling data parallel when to reduce them. With one, the pipeline schedule runs
them through this rank's stages in 1F1B order. Either way the loss is the mean next-token
cross entropy and the gradient is that of the mean over the whole global batch.

A step leaves its loss and gradient norm on the device: ReportWindow keeps them until the
loop's next report, which reads the whole window back in one go. Reading a value on every
step would make the host wait for the GPU to drain its queue every step, and the GPU then
idles while the host launches the next step's first kernels. ReportCadence decides on which
steps that report comes (the same on every rank) and sends what it read to rank 0's reporter.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F

from contract import WorkerRunConfig
from worker.cross_group import CrossGroupSync
from worker.data import TokenBatches
from worker.fault_points import NO_FAULTS, FaultPoints
from worker.launch import node_name
from worker.parallel import ParallelDims, TrainingModel
from worker.parallel.context_parallel import shard_sequence
from worker.parallel.data_parallel import clip_grad_norm, set_micro_batch_sync
from worker.reporter import Reporter
from worker.stragglers import UpdateTimer, node_update_s, rank_nodes

# At most this many steps between two reports: bounds the device values a window holds
# and how late a stop is seen when a step is much faster than report_interval_s.
MAX_STEPS_PER_REPORT = 100


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy, in fp32 whatever the compute dtype."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def build_optimizer(part: torch.nn.Module, config: WorkerRunConfig) -> torch.optim.AdamW:
    """AdamW over one model part (a pipeline stage has its own: its parameters live only on
    its ranks), with Llama's betas; its learning rate is set every step by the loop."""
    decay = [p for p in part.parameters() if p.dim() >= 2]  # no weight decay on norm gains
    no_decay = [p for p in part.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=config.lr,
        betas=(0.9, 0.95),
        # One multi-tensor kernel per update, as torch chooses by itself on a GPU; on a CPU
        # it would loop over the parameters in Python (half the update time of a small model).
        foreach=True,
    )


def _to_device(tokens: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a CPU batch to `device` without making the host wait for the GPU.

    A copy from pageable memory is synchronous (CUDA stages it, and PyTorch then waits for
    the stream); from pinned memory it is queued like a kernel (nanoGPT does the same)."""
    if device.type != "cuda":
        return tokens.to(device)
    return tokens.pin_memory().to(device, non_blocking=True)


def forward_backward(
    model: TrainingModel,
    batches: TokenBatches,
    step: int,
    config: WorkerRunConfig,
    dims: ParallelDims,
    device: torch.device,
    shares: Sequence[int] = (0,),
) -> tuple[torch.Tensor, int]:
    """Every micro batch of `step` this group trains, forward and backward, gradients
    accumulating in the parameters. `shares` are the shares of the global batch it trains
    (worker/cross_group.py; a run without replica groups has one, 0): share v is the run's
    data-parallel ranks v x dims.dp .. (v + 1) x dims.dp - 1. Returns the sum of the
    micro-batch losses this rank computed, and how many."""
    accum, mbs = config.grad_accum, config.layout.micro_batch_size
    dp_rank, cp_rank = dims.mesh("dp").get_local_rank(), dims.mesh("cp").get_local_rank()
    run_dp = config.layout.dp  # the run's data-parallel degree: every share's ranks
    micro = []
    for share in shares:
        for m in range(accum):
            rows = share * dims.dp + dp_rank
            inputs, targets = batches.micro_batch(step, m, rows, run_dp, mbs)
            # Context parallel: each cp rank keeps its two chunks of every sequence.
            micro.append(
                tuple(
                    _to_device(shard_sequence(t, dims.cp, cp_rank), device)
                    for t in (inputs, targets)
                )
            )
    if model.schedule is not None:
        # The schedule cuts a share's batch back into `accum` micro batches and runs 1F1B
        # (once per share: its loss is scaled by 1 / accum, so gradients add up across
        # calls; worker/parallel/pipeline.py).
        # sync: activations and their gradients go point-to-point between stages.
        losses: list[torch.Tensor] = []
        for first in range(0, len(micro), accum):
            chunk = micro[first : first + accum]
            inputs, targets = (torch.cat([mb[i] for mb in chunk]) for i in (0, 1))
            share_losses: list[torch.Tensor] = []  # the schedule clears the list it fills
            with model.autocast():
                if model.has_first_stage:
                    model.schedule.step(inputs, target=targets, losses=share_losses)
                else:
                    model.schedule.step(target=targets, losses=share_losses)
            losses += share_losses
        total = torch.stack(losses).sum() * accum if losses else torch.zeros((), device=device)
        return total.detach(), len(losses)
    total = torch.zeros((), device=device)
    for m, (inputs, targets) in enumerate(micro):
        # sync: data parallel reduces gradients during backward; on all but the last micro
        # batch it holds them back (DDP, ZeRO-1) so accumulation costs one reduction a step.
        set_micro_batch_sync(model.parts, config.layout.zero_stage, last=m == len(micro) - 1)
        with model.autocast():
            logits = model.parts[0](inputs)
        loss = next_token_loss(logits, targets)
        (loss / accum).backward()
        total += loss.detach()
    return total, len(micro)


def train_step(
    model: TrainingModel,
    optimizers: Sequence[torch.optim.Optimizer],
    batches: TokenBatches,
    step: int,
    lr: float,
    config: WorkerRunConfig,
    dims: ParallelDims,
    device: torch.device,
    sync: CrossGroupSync,
    before_update: Callable[[], None] | None = None,
    update_timer: UpdateTimer | None = None,
    fault_points: FaultPoints = NO_FAULTS,
    data_position: int | None = None,
) -> tuple[torch.Tensor, int, torch.Tensor] | None:
    """One optimizer step, without a host sync: returns the loss sum and its count over
    every share (as forward_backward) and the global gradient norm before clipping, on the
    device; None when the replica groups voted the step down (nothing was applied: the
    loop trains it again). `sync` is the cross-group synchronizer (worker/cross_group.py).
    `before_update` runs just before the weights change (the loop waits there for a
    checkpoint's copy of them). `update_timer` times the update, the rank's own work with
    no collective in it (worker/stragglers.py). `fault_points`: where a test's fault may
    enter the step (worker/fault_points.py). `data_position`: where in the data `step`'s
    batch is (contract.run_config.data_step; default `step` itself)."""
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr  # a Python float: AdamW reads it on the host
    position = step if data_position is None else data_position
    loss_sum, num_losses = forward_backward(
        model, batches, position, config, dims, device, sync.shares()
    )
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    # sync (groups): gradient shards and losses summed with the same mesh coordinate in
    # every other group (nothing without replica groups).
    loss_sum, num_losses = sync.sum_gradients(grads, loss_sum, num_losses)
    grad_norm = clip_grad_norm(model.parameters(), config.grad_clip, dims.mesh("pp"))
    if not sync.should_commit():  # a group failed during the step: apply nothing
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        return None
    if before_update is not None:
        before_update()
    if update_timer is not None:
        update_timer.start()
    fault_points.in_update(step, dist.get_rank())  # slow_step: in the timed update
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if update_timer is not None:
        update_timer.stop()
    return loss_sum, num_losses, grad_norm


@dataclass(frozen=True)
class StepFigures:
    """One step's figures as the report reads them back."""

    step: int
    loss: float  # mean next-token loss over the global batch
    grad_norm: float  # before clipping
    lr: float


@dataclass(frozen=True)
class WindowReport:
    """What every rank learns at a report: the window's steps, whether any rank asked to
    stop, and rank 0's choice of how many steps the next window holds."""

    steps: list[StepFigures]
    stop: bool
    steps_to_next_report: int
    elapsed_s: float  # wall time from the previous report's end to this one's read-back
    # Every rank's mean update time over the window, by rank (worker/stragglers.py).
    rank_update_s: list[float] = field(default_factory=list)
    # Steps between checkpoints from now on, as the service last told rank 0 (0: no word).
    checkpoint_every: int = 0

    @property
    def step_time_s(self) -> float:
        """Mean step time over the window: the only honest per-step time on a GPU, where
        the host runs ahead and a step's own wall time is mostly kernel launches."""
        return self.elapsed_s / len(self.steps)

    @property
    def non_finite_steps(self) -> list[int]:
        return [
            s.step for s in self.steps if not (math.isfinite(s.loss) and math.isfinite(s.grad_norm))
        ]


class ReportWindow:
    """The steps since the last report, their loss sums and gradient norms still on the
    device. Adding a step never synchronises; closing the window does, once."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.started = time.perf_counter()
        self._steps: list[int] = []
        self._lrs: list[float] = []
        self._loss_sums: list[torch.Tensor] = []
        self._num_losses: list[int] = []
        self._grad_norms: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self._steps)

    def add(
        self, step: int, loss_sum: torch.Tensor, num_losses: int, grad_norm: torch.Tensor, lr: float
    ) -> None:
        """Keep one step's device values (no sync: nothing is read back)."""
        self._steps.append(step)
        self._lrs.append(lr)
        self._loss_sums.append(loss_sum.detach().float())
        self._num_losses.append(num_losses)
        self._grad_norms.append(grad_norm.detach().float())

    def close(
        self,
        stop_requested: bool,
        steps_to_next_report: int,
        update_s: float = 0.0,
        checkpoint_every: int = 0,
    ) -> WindowReport:
        """Every rank, on the same step: reduce the window over the ranks and read it back.

        One all-reduce sums, over the ranks that computed one, each step's losses and their
        count (the last pipeline stage: so every rank gets the global mean), and every
        rank's wish to stop; `steps_to_next_report` is counted from rank 0 alone (the
        others pass 0), so that all ranks agree on when the next report comes. It also
        carries `update_s`, this rank's mean update time, in this rank's own slot of a
        world-sized vector: the sum is every rank's figure (8 bytes a rank, no collective
        of its own). `checkpoint_every` is rank 0's word from the service (the others pass
        0), so that every rank checkpoints on the same steps.
        """
        n = len(self._steps)
        if n == 0:
            raise RuntimeError("a report needs at least one step since the last one")
        rank, world = dist.get_rank(), dist.get_world_size()
        slots = [0.0] * world
        slots[rank] = update_s
        host = [
            *map(float, self._num_losses),
            float(stop_requested),
            float(steps_to_next_report),
            float(checkpoint_every),
            *slots,
        ]
        # sync: a copy of host values to the device; the report waits for the GPU anyway.
        summed = torch.cat([torch.stack(self._loss_sums), torch.tensor(host).to(self.device)])
        dist.all_reduce(summed)  # sync: every rank's losses and stop wishes, one collective
        # Host sync, the one per report: the window's values come back in a single copy.
        # The gradient norm is already global on every rank (clip_grad_norm reduced it).
        values = torch.cat([summed, torch.stack(self._grad_norms)]).tolist()
        elapsed_s = time.perf_counter() - self.started
        loss_sums, counts = values[:n], values[n : 2 * n]
        stop, steps_to_next, every = values[2 * n], values[2 * n + 1], values[2 * n + 2]
        rank_update_s = values[2 * n + 3 : 2 * n + 3 + world]
        grad_norms = values[2 * n + 3 + world :]
        figures = [
            StepFigures(step, loss_sum / count, grad_norm, lr)
            for step, loss_sum, count, grad_norm, lr in zip(
                self._steps, loss_sums, counts, grad_norms, self._lrs, strict=True
            )
        ]
        return WindowReport(
            figures, stop > 0, max(1, round(steps_to_next)), elapsed_s, rank_update_s, round(every)
        )


class ReportCadence:
    """When the ranks report, and what a report tells rank 0's reporter.

    Reports are the loop's only host syncs. Every rank must report on the same steps (a
    report is a collective), so the cadence is counted in steps: every step at first,
    then as many as take about report_interval_s, as rank 0 measured and told the others
    at the previous report. Checkpoint steps and the last step always report (the loop
    asks for those). Slow nodes: every rank times its update (its own work, no collective
    in it); the reports carry every rank's mean, and rank 0 sends each node's slowest."""

    def __init__(
        self,
        config: WorkerRunConfig,
        reporter: Reporter,
        device: torch.device,
        trained: int,
        is_rank0: bool,
        time_limit_near: threading.Event | None,
    ) -> None:
        self.config, self.reporter, self.device, self.is_rank0 = config, reporter, device, is_rank0
        self.time_limit_near = time_limit_near or threading.Event()
        self.window = ReportWindow(device)
        self.next_step, self.steps_wish = trained + 1, 1
        self.update_timer, self.nodes = UpdateTimer(device), rank_nodes(node_name())
        self.cancel = self.stopped = False  # rank 0 saw the service cancel; a report said stop

    def add(
        self, step: int, loss_sum: torch.Tensor, num_losses: int, grad_norm: torch.Tensor, lr: float
    ) -> None:
        self.window.add(step, loss_sum, num_losses, grad_norm, lr)

    def due(self, step: int) -> bool:
        return step >= self.next_step

    def close(self) -> WindowReport:
        """Every rank, on the same step. sync (host and ranks): the window's losses come
        back, and with them any rank's reason to stop (the service cancelling the run, seen
        by rank 0; Slurm's time-limit signal, which ranks may see at different steps), so
        that every rank stops after the same step. A stop is therefore seen within about
        report_interval_s, well inside the lead time of Slurm's signal."""
        self.cancel = self.is_rank0 and self.reporter.cancel_requested
        report = self.window.close(
            stop_requested=self.cancel or self.time_limit_near.is_set(),
            steps_to_next_report=self.steps_wish if self.is_rank0 else 0,
            update_s=self.update_timer.take_mean_s(),
            checkpoint_every=(self.reporter.checkpoint_every or 0) if self.is_rank0 else 0,
        )
        self.stopped = report.stop
        return report

    def open_next(self, step: int, report: WindowReport) -> None:
        """After what runs between windows (an evaluation): the next window and when it
        reports; rank 0 reports the closed one."""
        self.window = ReportWindow(self.device)
        self.next_step = step + report.steps_to_next_report
        wish = int(self.config.report_interval_s / report.step_time_s)
        self.steps_wish = max(1, min(MAX_STEPS_PER_REPORT, wish))
        if self.is_rank0:
            self._send(report)
            self.reporter.node_update_s(step, node_update_s(report.rank_update_s, self.nodes))

    def _send(self, report: WindowReport) -> None:
        """Rank 0: one line for the window's last step, and one metric row per step."""
        tokens_per_s = self.config.global_batch * self.config.seq_len / report.step_time_s
        last = report.steps[-1]
        print(
            f"step {last.step}/{self.config.steps} loss {last.loss:.4f} lr {last.lr:.2e} "
            f"grad_norm {last.grad_norm:.3f} tok/s {tokens_per_s:.0f} "
            f"step_time {report.step_time_s:.3f}s",
            flush=True,
        )
        if report.non_finite_steps:  # checked here, in bulk: reading them per step would sync
            print(f"warning: non-finite loss or gradient norm at steps {report.non_finite_steps}")
        for figures in report.steps:
            # A non-finite loss has no JSON form (the service's API would fail on it): the
            # anomaly report names it instead (worker/anomaly.py), and the step has no row.
            if math.isfinite(figures.loss):
                self.reporter.metric(
                    figures.step, figures.loss, tokens_per_s, report.step_time_s, lr=figures.lr
                )

    def say_why_stopping(self, step: int) -> None:
        if self.is_rank0:
            why = "the service is cancelling the run" if self.cancel else "Slurm time limit near"
            print(f"stopping after step {step}: {why}", flush=True)
