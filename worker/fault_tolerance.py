"""The training loop of one replica group: torchft's per-step fault tolerance.

A fault-tolerant run is several replica groups, each a complete copy of the model (sharded
inside the group as its layout says) and each its own Slurm job. Every step, the groups
agree on a quorum through torchft's lighthouse (the service starts one per run), average
their gradients over the groups in the quorum, and commit the step only if every
cross-group collective succeeded. A group that lost a node simply drops out of the next
quorum: the others go on without stopping. Its replacement (a new Slurm job on a spare)
joins the quorum, sees it is behind, and heals: torchft copies the weights, the optimizer
state and our counters from a live peer over HTTP, with no disk read. At most the one step
in flight when the group died is computed again.

The global batch stays what the user asked: the run's data-parallel degree D is cut into
`groups` equal shares, and the participating groups split the shares of all groups between
them (group with participating rank r takes shares r, r + P, ...), accumulating gradients,
so every step trains on exactly the sequences an uninterrupted run would, in the same
order; the loss then matches it up to the order of floating-point sums.

What torchft gives: the lighthouse, the quorum, the fault-tolerant cross-group process
group, healing over HTTP and the commit vote. What this module adds: the data split that
keeps the global batch, the mapping onto the run's own model, optimizer, checkpoint and
report code (worker/train.py's pieces), and which group writes checkpoints (the group with
participating rank 0, one writer at a time).
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL
from torchft.process_group import ProcessGroupWrapper

from contract import ReplicaGroupConfig, WorkerRunConfig, group_layout
from worker import checkpoint
from worker.data import TokenBatches, open_corpus
from worker.distributed import LaunchEnv, init_distributed, pick_device, shutdown_distributed
from worker.faults import maybe_crash, pace, set_context
from worker.parallel import ParallelDims, TrainingModel, build_training_model, check_supported
from worker.parallel.data_parallel import clip_grad_norm, set_micro_batch_sync
from worker.reporter import Reporter
from worker.shards import local_shard
from worker.step import ReportWindow, build_optimizer, next_token_loss
from worker.train import (
    MAX_STEPS_PER_REPORT,
    TrainResult,
    _report,
    lr_at,
    register_commit,
    resume_from_checkpoint,
)

# A replacement group waits this long for a quorum (its peers may be mid-step, or the
# lighthouse waiting on a group that just died); survivors never wait this long.
QUORUM_TIMEOUT_S = 300.0


def train_replica_group(
    config: WorkerRunConfig, launch: LaunchEnv, reporter: Reporter
) -> TrainResult:
    """Train this attempt's replica group until the run's last step."""
    assert config.fault_tolerance is not None
    layout = group_layout(config.layout, config.fault_tolerance.groups)
    check_supported(layout)  # before any collective: every rank refuses alike
    set_context(config.name, config.attempt_number)  # faults may name the run or attempt
    # scancel means this group is being replaced (its node failed): leave at once, so the
    # peers' next collective fails now and the lighthouse drops the group after its
    # heartbeat timeout. submitit's handler would ignore SIGTERM and leave the ranks
    # running until Slurm's KillWait sends SIGKILL, while every peer waits on them.
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM))
    device = pick_device(launch.local_rank)
    init_distributed(launch, device)  # the group's own process group (its Slurm job)
    try:
        return replica_loop(config, launch, reporter, device)
    finally:
        shutdown_distributed()


def _cross_group_pg(ft: ReplicaGroupConfig) -> ProcessGroupWrapper:
    """The reconfigurable process group joining this rank to its peers in the other groups
    (the ranks with the same group rank); torchft builds a new one for every new quorum."""
    timeout = timedelta(seconds=ft.timeout_s)
    return (
        ProcessGroupNCCL(timeout=timeout)
        if torch.cuda.is_available()
        else ProcessGroupGloo(timeout=timeout)
    )


def drop_cross_group_links(pg: ProcessGroupWrapper) -> None:
    """After a failed step: close this rank's links to the other groups now, not at the next
    quorum. A ring collective only tells the dead group's two neighbours at once (their
    sockets reset); every other survivor waits in its receive until the collective timeout
    (10 s: the whole stall of a failure). Closing the links here resets theirs, and theirs
    the next ones', so every survivor learns within a fraction of a second and asks the
    lighthouse for the next quorum. gloo's abort() alone keeps the sockets open; they close
    when the last reference to the context goes (the collectives' handles went with
    _sum_across_groups' frame), hence the collect. The next quorum has a new id (the
    lighthouse bumps it on a commit failure), so torchft configures a fresh group before
    the next collective."""
    pg.abort()
    gc.collect()


def _manager(
    ft: ReplicaGroupConfig, config: WorkerRunConfig, launch: LaunchEnv, pg: ProcessGroupWrapper
) -> Manager:
    """torchft's manager for this rank: the group's rank 0 runs the group's manager server
    and talks to the lighthouse; every rank joins the cross-group process group `pg`."""
    timeout = timedelta(seconds=ft.timeout_s)
    return Manager(
        pg=pg,
        load_state_dict=None,
        state_dict=None,
        min_replica_size=ft.min_healthy_groups,
        use_async_quorum=False,  # heal before the forward pass, in the step that needs it
        timeout=timeout,
        quorum_timeout=timedelta(seconds=QUORUM_TIMEOUT_S),
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        store_addr=launch.master_addr,  # the group's TCPStore (init_distributed's)
        store_port=launch.master_port,
        lighthouse_addr=ft.lighthouse_addr,
        replica_id=f"run{config.run_id}_group{ft.group}",
    )


def _forward_backward_shares(
    model: TrainingModel,
    batches: TokenBatches,
    step: int,
    config: WorkerRunConfig,
    shares: list[int],
    group_dp: int,
    dp_rank: int,
    device: torch.device,
) -> torch.Tensor:
    """This rank's micro batches of `step` for every share it trains: share v's dp ranks
    are v * group_dp .. (v + 1) * group_dp - 1 of the run's dp degree. Gradients accumulate;
    the group reduces them once, on the very last micro batch. Returns the loss sum."""
    accum, mbs, dp = config.grad_accum, config.layout.micro_batch_size, config.layout.dp
    total = torch.zeros((), device=device)
    micro = [(v, m) for v in shares for m in range(accum)]
    for i, (share, m) in enumerate(micro):
        inputs, targets = batches.micro_batch(step, m, share * group_dp + dp_rank, dp, mbs)
        set_micro_batch_sync(model.parts, config.layout.zero_stage, last=i == len(micro) - 1)
        with model.autocast():
            logits = model.parts[0](inputs.to(device))
        loss = next_token_loss(logits, targets.to(device))
        # Each share's gradient is the mean over its rows; the groups' sum over all shares
        # is divided by the number of shares after the cross-group reduction.
        (loss / accum).backward()
        total += loss.detach()
    return total


def _sum_across_groups(manager: Manager, grads: list[torch.Tensor], loss_sum: torch.Tensor) -> None:
    """Sum the gradients and the loss over the groups in the quorum, in place. A failure is
    recorded by the manager (should_commit then says no), never raised. The collectives'
    handles live and die in this frame: a handle keeps the group's sockets open, and
    drop_cross_group_links needs them closed."""
    works = [manager.allreduce(local_shard(g), reduce_op=dist.ReduceOp.SUM) for g in grads]
    works.append(manager.allreduce(loss_sum, reduce_op=dist.ReduceOp.SUM))
    for work in works:
        work.wait()


def replica_loop(
    config: WorkerRunConfig, launch: LaunchEnv, reporter: Reporter, device: torch.device
) -> TrainResult:
    """Train on the group's default process group and torchft's cross-group one."""
    ft = config.fault_tolerance
    assert ft is not None
    rank, world_size = dist.get_rank(), dist.get_world_size()
    is_rank0 = rank == 0  # the group's rank 0: reports, commit markers when it writes
    layout = group_layout(config.layout, ft.groups)
    group_config = config.model_copy(update={"layout": layout})  # the model's builders
    dims = ParallelDims.from_layout(layout, world_size)
    dims.build_mesh(device.type)
    torch.manual_seed(config.seed + rank)

    if is_rank0:
        open_corpus(config.data, Path(config.data_cache_dir))
    dist.barrier()  # sync: the shards exist before any other rank maps them
    stream = open_corpus(config.data, Path(config.data_cache_dir))
    batches = TokenBatches(stream, config.seq_len, config.global_batch, config.seed)

    model = build_training_model(group_config, dims, device, next_token_loss)
    optimizers = [build_optimizer(part, config) for part in model.parts]
    params = [p for part in model.parts for p in part.parameters()]
    trainer = checkpoint.TrainerState()
    state = checkpoint.training_state(model.parts, optimizers, trainer, rank)
    checkpointer = checkpoint.AsyncCheckpointer(config.checkpoint_path, state)
    cross_group = _cross_group_pg(ft)
    manager = _manager(ft, config, launch, cross_group)
    # Healing sends exactly what a checkpoint holds, from a live peer instead of the disk.
    manager.register_state_dict_fn(
        "train",
        lambda sd: [state[k].load_state_dict(v) for k, v in sd.items()],
        lambda: {k: v.state_dict() for k, v in state.items()},
    )
    if config.resume_from is not None:  # the classic path: every group from the same disk step
        # A corrupt one is reported as such, so the next attempt resumes from the one before.
        resume_from_checkpoint(config.resume_from, state, reporter, is_rank0)
        manager.load_state_dict({"step": trainer.step, "batches_committed": trainer.step})

    last_checkpoint_step = trainer.step
    tokens_per_step = config.global_batch * config.seq_len
    window = ReportWindow(device)
    next_report_step, wish = trainer.step + 1, 1
    dp_rank = dims.mesh("dp").get_local_rank()
    stopped_early, writer = False, False
    time_limit_near = threading.Event()

    def committed(saved: checkpoint.SavedCheckpoint | None) -> None:
        nonlocal last_checkpoint_step
        if saved is not None and register_commit(saved, config, reporter, is_rank0):
            last_checkpoint_step = saved.step

    try:
        while manager.current_step() < config.steps:
            step_started = time.monotonic()
            # sync (groups): the quorum of live groups for this step; a group that is
            # behind (a replacement) heals here from a live peer before its forward pass.
            manager.start_quorum()
            step = manager.current_step() + 1
            if step > config.steps:
                break
            if ft.heal_from_peer and step == 1 and manager.num_participants() == 1:
                # A replacement alone in the quorum: its peers are gone (or finished), so
                # there is nothing to heal from; training from scratch would overwrite the
                # run's checkpoints. The service takes the classic path instead.
                raise RuntimeError("no live replica group to heal from")
            lr = lr_at(step, config)
            for optimizer in optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = lr
            participants = manager.num_participants()
            me = manager.participating_rank() or 0
            shares = [v for v in range(ft.groups) if v % participants == me]
            loss_sum = _forward_backward_shares(
                model, batches, step, config, shares, layout.dp, dp_rank, device
            )
            # sync (groups): gradients summed over the groups in the quorum; a dead peer
            # makes the reduction fail, which should_commit below turns into a retry.
            _sum_across_groups(manager, [p.grad for p in params if p.grad is not None], loss_sum)
            for p in params:
                if p.grad is not None:
                    local_shard(p.grad).div_(ft.groups)  # the mean over every share's rows
            grad_norm = clip_grad_norm(model.parts, config.grad_clip, dims.mesh("pp"))
            # sync (groups): every group votes; one failed collective anywhere and no
            # group applies this step, they all compute it again with the next quorum.
            ok = manager.should_commit()
            if ok:
                # A save returns once its host copy has started, not finished (HostCopy):
                # the copy must end before the weights change, or the checkpoint labelled
                # with the last save's step holds some of this step's weights, checksummed
                # and committed as they are (train.py waits at the same point).
                checkpointer.wait_for_staging()
                for optimizer in optimizers:
                    optimizer.step()
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
            if not ok:
                drop_cross_group_links(cross_group)
                continue
            trainer.step = trainer.data_step = step
            trainer.consumed_tokens += tokens_per_step
            window.add(step, loss_sum, config.grad_accum * ft.groups, grad_norm, lr)

            checkpoint_due = step % config.checkpoint_every == 0 or step == config.steps
            stop = False
            if step >= next_report_step or checkpoint_due:
                cancel = is_rank0 and reporter.cancel_requested
                report = window.close(
                    stop_requested=cancel or time_limit_near.is_set(),
                    steps_to_next_report=wish if is_rank0 else 0,
                )
                window = ReportWindow(device)
                stop, next_report_step = report.stop, step + report.steps_to_next_report
                wish = max(
                    1, min(MAX_STEPS_PER_REPORT, int(config.report_interval_s / report.step_time_s))
                )
                if is_rank0:
                    _report(report, config, reporter, tokens_per_step)

            committed(checkpointer.poll())
            last = step == config.steps or stop
            # One writer per step: the group with participating rank 0 in this quorum
            # (the same answer on every rank of a group, as they share the quorum).
            writer = manager.participating_rank() == 0
            if writer and (checkpoint_due or last):
                committed(checkpointer.wait())
                if is_rank0:
                    target = checkpoint.step_folder(config.checkpoint_path, step).resolve()
                    reporter.checkpoint(step, str(target), "WRITING")
                checkpointer.save(step)  # sync: the state's host copy, within the group
                if last:
                    committed(checkpointer.wait())
            maybe_crash("after_step", step, rank)
            pace(step, rank, step_started)  # pace_step: the tests' floor on a step's time
            if stop:
                stopped_early = True
                break
        committed(checkpointer.wait())
    finally:
        manager.shutdown(wait=False)
    if is_rank0 and writer and not stopped_early:
        reporter.finish(trainer.step, last_checkpoint_step)
    return TrainResult(trainer.step, last_checkpoint_step, stopped_early)
