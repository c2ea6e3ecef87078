"""Fault injection for recovery tests: crash, fail or corrupt at a named point of a step.

RUNYARD_FAULT holds one fault or several separated by commas, each
    <fault>:<step>[:<rank>[:<attempt>]][@<run name>][=<seconds>]
rank defaults to 0 ("*": every rank), attempt to every attempt, run name to every run;
seconds is the duration of the faults that sleep. So "raise_after_step:30:*" fails every
attempt of every run at step 30, "corrupt_after_commit:40:0:1@ck-corrupt" corrupts only run
ck-corrupt's first attempt, and "pace_step:1:*=0.06" makes every step of every run take at
least 60 ms.
Faults (and the point of the step where each fires):
  after_step            SIGKILL, like a lost node: no cleanup, no exit handler. The optimizer
                        step is done (a checkpoint due at it may still be writing: saves
                        are asynchronous).
  before_commit         SIGKILL once every rank wrote its checkpoint files, before the
                        COMMITTED marker (with asynchronous saves, at the step where rank 0
                        finds the save complete).
  raise_after_step      raise InjectedFault after the optimizer step: a deterministic bug
                        (the same exception at the same step on every retry).
  corrupt_before_commit rank 0 flips one byte of its checkpoint file after the checksums
                        were recorded, just before the commit verifies them (in the thread
                        that verifies, once every rank's files are written): the commit
                        must refuse it.
  corrupt_after_commit  rank 0 flips one byte of a data file once the COMMITTED marker is
                        written: only a load can find it.
  nan_at_step           the step's loss reads NaN on this rank (multiplied by NaN on the
                        device, no host sync): as a bad batch or an overflow would leave it.
                        The weights are untouched; the loop finds it at the next report.
  slow_step             from this step on, this rank sleeps its seconds (else
                        RUNYARD_FAULT_SLOW_S, default 0.3) in its update, as a throttled or
                        failing GPU would stretch it: the straggler check must flag its node.
  pace_step             from this step on, each of this rank's steps takes at least its
                        seconds (required) per share of the global batch it trained: the
                        rank sleeps out the rest at the step's end, outside the timed
                        update. Not a failure: it gives the integration tests runs whose
                        length in seconds does not depend on how fast the machine computes,
                        so a fault still lands while the run trains; and it stands in for
                        a device's compute, which leaves the host idle and grows with the
                        rows trained (a replica group covering a lost group's share takes
                        twice as long), for the recovery bench (bench/recovery_compare.py).
  slow_checkpoint_write the checkpoint writer of this step's save sleeps its seconds (else
                        RUNYARD_FAULT_SLOW_S) before writing, the GIL released, as a slow
                        filesystem would stretch it: training steps on beside it.
  gil_checkpoint_write  the checkpoint writer of this step's save holds the GIL for its
                        seconds (else RUNYARD_FAULT_SLOW_S) before writing, as serialisation
                        that never releases it would: training's thread stops meanwhile,
                        and the save's cost (worker/checkpoint_cost.py) must show it.
  flip_param            after this step's update, this rank flips a low mantissa bit of one
                        value of its parameters: its data-parallel replica silently
                        differs from the others, as a bit flip in a GPU's memory or ALU
                        would leave it. The loss barely moves; the SDC check must find it.
Unset in production; the e2e suite, tests/unit/worker and tests/integration set it.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from worker.shards import INT_VIEWS, local_shard

# fault -> the point of the step where it fires
FAULTS = {
    "after_step": "after_step",
    "before_commit": "before_commit",
    "raise_after_step": "after_step",
    "corrupt_before_commit": "before_verify",
    "corrupt_after_commit": "after_commit",
    "nan_at_step": "step_values",
    "slow_step": "update",
    "flip_param": "after_update",
    "slow_checkpoint_write": "write",
    "gil_checkpoint_write": "write",
    "pace_step": "step_end",
}
# Faults that fire on every step from theirs on, not only at it.
FROM_STEP_ON = frozenset({"slow_step", "pace_step"})
# Faults that sleep, and so take =<seconds>.
SLEEPING = frozenset({"slow_step", "pace_step", "slow_checkpoint_write", "gil_checkpoint_write"})
DEFAULT_SLOW_S = 0.3
POINTS = tuple(sorted(set(FAULTS.values())))


class InjectedFault(RuntimeError):
    """What raise_after_step raises: an ordinary exception, as a bug in training code."""


@dataclass(frozen=True)
class Fault:
    name: str
    step: int
    rank: int | None  # None: every rank
    attempt: int | None  # None: every attempt
    run: str | None  # None: every run
    seconds: float | None = None  # how long a fault that sleeps sleeps

    def fires(self, point: str, step: int, rank: int) -> bool:
        return (
            FAULTS[self.name] == point
            and (self.step <= step if self.name in FROM_STEP_ON else self.step == step)
            and self.rank in (None, rank)
            and self.attempt in (None, _context["attempt"])
            and self.run in (None, _context["run"])
        )


_context: dict[str, object] = {"run": None, "attempt": None}


def set_context(run: str, attempt: int) -> None:
    """Which run and attempt this process trains (faults may name either)."""
    _context.update(run=run, attempt=attempt)


def snapshot() -> dict[str, object]:
    """This process's faults and context, for work that runs in another process (the
    checkpoint writer's): restore() them there before a fault point."""
    return {"spec": os.environ.get("RUNYARD_FAULT"), **_context}


def restore(saved: dict[str, object]) -> None:
    """Take the faults and context of the process that made `saved` (see snapshot())."""
    spec = saved["spec"]
    if spec:
        os.environ["RUNYARD_FAULT"] = str(spec)
    else:
        os.environ.pop("RUNYARD_FAULT", None)
    _context.update(run=saved["run"], attempt=saved["attempt"])


def parse(spec: str) -> list[Fault]:
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        item, has_seconds, seconds = item.partition("=")
        body, _, run = item.partition("@")
        name, step, *rest = body.split(":")
        if name not in FAULTS:
            raise ValueError(f"RUNYARD_FAULT fault {name!r} is not one of {tuple(FAULTS)}")
        if name == "pace_step" and not has_seconds:
            raise ValueError(f"RUNYARD_FAULT {item!r}: pace_step needs =<seconds>")
        if has_seconds and name not in SLEEPING:
            raise ValueError(f"RUNYARD_FAULT {item!r}: only {sorted(SLEEPING)} take =<seconds>")
        duration = _seconds(item, seconds) if has_seconds else None
        rank = None if rest and rest[0] == "*" else int(rest[0]) if rest else 0
        attempt = int(rest[1]) if len(rest) > 1 else None
        faults.append(Fault(name, int(step), rank, attempt, run or None, duration))
    return faults


def _seconds(item: str, text: str) -> float:
    """A fault's duration: a finite number of seconds, zero or more (time.sleep refuses the
    rest, in the middle of a rank's step)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"RUNYARD_FAULT {item!r}: ={text} is not a number of seconds >= 0")
    return seconds


def _firing(point: str, step: int, rank: int) -> list[Fault]:
    spec = os.environ.get("RUNYARD_FAULT")
    if not spec:
        return []
    return [fault for fault in parse(spec) if fault.fires(point, step, rank)]


def maybe_crash(point: str, step: int, rank: int, folder: Path | None = None) -> None:
    """Act on every fault RUNYARD_FAULT names for this point, step and rank (and this
    process's run and attempt). `folder`: the checkpoint being committed, if any."""
    for fault in _firing(point, step, rank):
        if fault.name.startswith("corrupt_"):
            assert folder is not None, f"{fault.name} fires only where a checkpoint is committed"
            corrupt_one_byte(folder, rank)
        elif fault.name == "raise_after_step":
            print(f"RUNYARD_FAULT: raising on rank {rank} at step {step}", flush=True)
            raise InjectedFault(f"injected failure at step {step}")
        else:
            print(f"RUNYARD_FAULT: killing rank {rank} at {point} of step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def poisoned(step: int, rank: int) -> bool:
    """Whether nan_at_step names this step and rank (and this process's run and attempt):
    the loop then multiplies the step's loss by NaN."""
    return any(fault.name == "nan_at_step" for fault in _firing("step_values", step, rank))


def slow_down(step: int, rank: int) -> float:
    """Sleep as slow_step says for this step and rank; how long it slept (0: no fault)."""
    firing = _firing("update", step, rank)
    if not firing:
        return 0.0
    default = float(os.environ.get("RUNYARD_FAULT_SLOW_S", DEFAULT_SLOW_S))
    seconds = max(default if f.seconds is None else f.seconds for f in firing)
    time.sleep(seconds)
    return seconds


def stall_write(step: int, rank: int) -> float:
    """In the checkpoint writer's thread, before it writes `step`'s files: sleep as
    slow_checkpoint_write says, hold the GIL as gil_checkpoint_write says. How long in all."""
    total = 0.0
    for fault in _firing("write", step, rank):
        default = float(os.environ.get("RUNYARD_FAULT_SLOW_S", DEFAULT_SLOW_S))
        seconds = default if fault.seconds is None else fault.seconds
        print(f"RUNYARD_FAULT: {fault.name} {seconds}s on rank {rank}, step {step}", flush=True)
        if fault.name == "gil_checkpoint_write":
            # A C function called through ctypes.PyDLL keeps the GIL (CDLL would release it).
            ctypes.PyDLL(None).usleep(ctypes.c_uint(round(seconds * 1e6)))
        else:
            time.sleep(seconds)
        total += seconds
    return total


def pace(step: int, rank: int, step_started: float, shares: int = 1) -> float:
    """If pace_step names this step and rank: sleep until the step, begun at `step_started`
    (time.monotonic()), has taken the longest pace named times the `shares` of the global
    batch it trained. How long it slept."""
    firing = _firing("step_end", step, rank)
    if not firing:
        return 0.0
    floor = max(f.seconds or 0.0 for f in firing) * shares
    rest = floor - (time.monotonic() - step_started)
    if rest > 0:
        time.sleep(rest)
    return max(rest, 0.0)


def flip_param(step: int, rank: int, parameters: Iterable[torch.Tensor]) -> bool:
    """If flip_param names this step and rank: flip a low mantissa bit of the first value of
    this rank's first parameter shard, in place (the value changes by about 1e-4 of itself:
    the loss cannot tell, and it is high enough that later updates do not round it away).
    True if it flipped one."""
    if not _firing("after_update", step, rank):
        return False
    local = local_shard(next(iter(parameters)))
    # The SDC check's own integer view of the value; the mantissa bit by its width: bit 10
    # of a float32's 23, bit 3 of a bfloat16's 7 (a float16's 10), bit 40 of a float64's 52.
    view = INT_VIEWS.get(local.dtype, torch.int64)
    bit = {torch.int32: 10, torch.int16: 3}.get(view, 40)
    with torch.no_grad():
        bits = local.view(-1)[:1].view(view)
        bits ^= 1 << bit
    print(f"RUNYARD_FAULT: flipped a parameter bit on rank {rank} after step {step}", flush=True)
    return True


def corrupt_one_byte(folder: Path, rank: int) -> Path:
    """Flip the middle byte of this rank's largest data file (any rank's, if it wrote none):
    the file keeps its size and name, as a bad disk or a torn copy would leave it."""
    files = sorted(folder.glob(f"__{rank}_*.distcp")) or sorted(folder.glob("__*_*.distcp"))
    target = max(files, key=lambda p: p.stat().st_size)
    with open(target, "r+b") as f:
        f.seek(target.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    print(f"RUNYARD_FAULT: flipped a byte of {target}", flush=True)
    return target
