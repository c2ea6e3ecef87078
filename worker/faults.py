"""Fault injection for recovery tests: crash, fail or corrupt at a named point of a step.

RUNYARD_FAULT holds one fault or several separated by commas, each
    <fault>:<step>[:<rank>[:<attempt>]][@<run name>][=<seconds>]
rank defaults to 0 ("*": every rank), attempt to every attempt, run name to every run;
seconds is the duration of the faults that sleep. So "raise_after_step:30:*" fails every
attempt of every run at step 30, "corrupt_after_commit:40:0:1@ck-corrupt" corrupts only run
ck-corrupt's first attempt, and "pace_step:1:*=0.06" makes every step of every run take at
least 60 ms.
Faults (and the point of the step where each fires: worker/fault_points.py names them):
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
Unset in production; the e2e suite, tests/unit/worker and tests/integration set it. A rank
reads it once, at its start (train(): fault_points_from_env): InjectedFaults keeps the faults
that name its run and attempt, and the loop, the step and the checkpointer call it at their
hook points (worker/fault_points.py); unset, they get NO_FAULTS, which does nothing.
"""

from __future__ import annotations

import ctypes
import math
import os
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from worker.fault_points import NO_FAULTS, FaultPoints
from worker.shards import INT_VIEWS, local_shard

# fault -> the hook point where it fires (a method of FaultPoints)
FAULTS = {
    "after_step": "after_step",
    "before_commit": "before_commit",
    "raise_after_step": "after_step",
    "corrupt_before_commit": "before_verify",
    "corrupt_after_commit": "after_commit",
    "nan_at_step": "step_values",
    "slow_step": "in_update",
    "flip_param": "after_update",
    "slow_checkpoint_write": "write",
    "gil_checkpoint_write": "write",
    "pace_step": "step_end",
}
# Faults that fire on every step from theirs on, not only at it.
FROM_STEP_ON = frozenset({"slow_step", "pace_step"})
# Faults that sleep, and so take =<seconds>.
SLEEPING = frozenset({"slow_step", "pace_step", "slow_checkpoint_write", "gil_checkpoint_write"})
DEFAULT_SLOW_S = 0.3  # how long a sleeping fault without =<seconds> sleeps
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

    def names(self, run: str | None, attempt: int | None) -> bool:
        """Whether this fault applies to `run`'s attempt `attempt`."""
        return self.run in (None, run) and self.attempt in (None, attempt)

    def fires(self, point: str, step: int, rank: int) -> bool:
        return (
            FAULTS[self.name] == point
            and (self.step <= step if self.name in FROM_STEP_ON else self.step == step)
            and self.rank in (None, rank)
        )


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


def fault_points(
    spec: str | None, run: str | None, attempt: int | None, slow_s: float = DEFAULT_SLOW_S
) -> FaultPoints:
    """The hook points for RUNYARD_FAULT's `spec` in `run`'s attempt `attempt`: the faults
    that name them, or NO_FAULTS if none does. `slow_s`: the sleep of a sleeping fault
    without =<seconds>. Raises ValueError on a spec that does not parse."""
    named = [fault for fault in parse(spec or "") if fault.names(run, attempt)]
    return InjectedFaults(named, slow_s) if named else NO_FAULTS


def fault_points_from_env(
    run: str | None, attempt: int | None, environ: Mapping[str, str] = os.environ
) -> FaultPoints:
    """What a rank's start-up calls, once: the hook points RUNYARD_FAULT (and
    RUNYARD_FAULT_SLOW_S) set for this run and attempt; NO_FAULTS where it is unset."""
    spec = environ.get("RUNYARD_FAULT")
    if not spec:
        return NO_FAULTS
    slow_s = float(environ.get("RUNYARD_FAULT_SLOW_S", DEFAULT_SLOW_S))
    return fault_points(spec, run, attempt, slow_s)


class InjectedFaults(FaultPoints):
    """The hook points acting on the faults of this rank's run and attempt. Plain data (the
    faults and a duration), so a checkpoint writer process receives it with its writer."""

    def __init__(self, faults: Sequence[Fault], slow_s: float = DEFAULT_SLOW_S) -> None:
        self.faults, self.slow_s = tuple(faults), slow_s

    def firing(self, point: str, step: int, rank: int) -> list[Fault]:
        """The faults that fire at `point` of `step` on `rank`, in the spec's order."""
        return [fault for fault in self.faults if fault.fires(point, step, rank)]

    def _seconds_of(self, fault: Fault) -> float:
        return self.slow_s if fault.seconds is None else fault.seconds

    def in_update(self, step: int, rank: int) -> None:
        """slow_step: sleep in the timed update, as a throttled or failing GPU would."""
        seconds = self.slow_down_s(step, rank)
        if seconds is not None:
            time.sleep(seconds)

    def slow_down_s(self, step: int, rank: int) -> float | None:
        """How long slow_step makes `step`'s update sleep on `rank` (None: it does not)."""
        firing = self.firing("in_update", step, rank)
        return max(map(self._seconds_of, firing)) if firing else None

    def after_update(self, step: int, rank: int, parameters: Sequence[torch.Tensor]) -> None:
        """flip_param: flip a low mantissa bit of the first value of this rank's first
        parameter shard, in place (the value changes by about 1e-4 of itself: the loss
        cannot tell, and it is high enough that later updates do not round it away)."""
        if not self.firing("after_update", step, rank):
            return
        local = local_shard(next(iter(parameters)))
        # The SDC check's own integer view of the value; the mantissa bit by its width: bit
        # 10 of a float32's 23, bit 3 of a bfloat16's 7 (a float16's 10), bit 40 of a
        # float64's 52.
        view = INT_VIEWS.get(local.dtype, torch.int64)
        bit = {torch.int32: 10, torch.int16: 3}.get(view, 40)
        with torch.no_grad():
            bits = local.view(-1)[:1].view(view)
            bits ^= 1 << bit
        print(
            f"RUNYARD_FAULT: flipped a parameter bit on rank {rank} after step {step}", flush=True
        )

    def step_values(self, step: int, rank: int, loss_sum: torch.Tensor) -> torch.Tensor:
        """nan_at_step: the loss multiplied by NaN on the device (no host sync), as a bad
        batch or an overflow would leave it."""
        if any(fault.name == "nan_at_step" for fault in self.firing("step_values", step, rank)):
            return loss_sum * float("nan")
        return loss_sum

    def after_step(self, step: int, rank: int) -> None:
        self._act("after_step", step, rank)

    def step_end(self, step: int, rank: int, started: float, shares: int) -> None:
        """pace_step: sleep out the rest of the step's floor (see pace_rest_s)."""
        rest = self.pace_rest_s(step, rank, started, shares)
        if rest > 0:
            time.sleep(rest)

    def pace_rest_s(self, step: int, rank: int, started: float, shares: int = 1) -> float:
        """How long `step`, begun at `started` (time.monotonic()), has left to sleep to take
        the longest pace named times the `shares` of the global batch it trained (0.0: no
        pace, or already slower than it)."""
        firing = self.firing("step_end", step, rank)
        if not firing:
            return 0.0
        floor = max(f.seconds or 0.0 for f in firing) * shares
        return max(floor - (time.monotonic() - started), 0.0)

    def write(self, step: int, rank: int) -> None:
        """slow_checkpoint_write sleeps, gil_checkpoint_write holds the GIL: in the writer's
        thread (or process), before it writes `step`'s files."""
        for fault in self.firing("write", step, rank):
            seconds = self._seconds_of(fault)
            print(f"RUNYARD_FAULT: {fault.name} {seconds}s on rank {rank}, step {step}", flush=True)
            if fault.name == "gil_checkpoint_write":
                # A C function called through ctypes.PyDLL keeps the GIL (CDLL would release it).
                ctypes.PyDLL(None).usleep(ctypes.c_uint(round(seconds * 1e6)))
            else:
                time.sleep(seconds)

    def before_verify(self, step: int, rank: int, folder: Path) -> None:
        self._act("before_verify", step, rank, folder)

    def before_commit(self, step: int, rank: int) -> None:
        self._act("before_commit", step, rank)

    def after_commit(self, step: int, rank: int, folder: Path) -> None:
        self._act("after_commit", step, rank, folder)

    def _act(self, point: str, step: int, rank: int, folder: Path | None = None) -> None:
        """The faults that crash, fail or corrupt: act on every one firing at `point`.
        `folder`: the checkpoint being committed, if any."""
        for fault in self.firing(point, step, rank):
            if fault.name.startswith("corrupt_"):
                assert folder is not None, f"{fault.name} fires only where a checkpoint commits"
                corrupt_one_byte(folder, rank)
            elif fault.name == "raise_after_step":
                print(f"RUNYARD_FAULT: raising on rank {rank} at step {step}", flush=True)
                raise InjectedFault(f"injected failure at step {step}")
            else:
                print(f"RUNYARD_FAULT: killing rank {rank} at {point} of step {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)


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
