"""Silent data corruption (issue 15): data-parallel replicas compare parameter checksums.

Ranks that differ only in their data-parallel coordinate hold the same parameters after
every step when the layout replicates them (zero_stage 0: `replicate`); every `sdc_check_every`
steps each rank sums the raw bits of its parameter shards (an int64 sum of the values'
bit patterns: exact, so one flipped bit changes it, and identical bits give identical sums
on any hardware), and one all_gather of two int64s per rank brings every rank every
checksum. Every rank reaches the same verdict from the same numbers, so all of them stop
together. Layouts that shard parameters over data parallel (ZeRO-1 to 3) hold no two equal
copies: the check is off for them (the loop says so once).

Who is wrong: among three or more replicas, the checksum a strict majority holds is right
and the others are the odd ones out. Across replica groups (worker/fault_tolerance.py) a
group outvoted by a strict majority of the groups stops alone: the majority holds equal,
trusted copies, trains on, and the outvoted group's replacement heals from one of them (the
fast path). Only a comparison without a majority stops every group for a rollback.
Two replicas (or an even split) cannot say which copy is right without a third: every
replica of that set is named, and the service drains them all (an SDC is rare, 1.4% of
Llama 3's interruptions, and keeping a corrupting GPU in the fleet costs more than a
healthy node's trip through diagnostics).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from worker.cross_group import GroupValues
from worker.parallel import ParallelDims
from worker.shards import INT_VIEWS, local_shard


class SilentDataCorruptionError(RuntimeError):
    """Raised by every rank after a mismatch: the attempt ends, the service rolls back."""


@dataclass(frozen=True)
class Mismatch:
    step: int
    ranks: list[int]  # the odd ones out (every replica of a set without a majority)
    ambiguous: bool  # no strict majority in some set: all its replicas are named

    @property
    def outvoted(self) -> bool:
        """A strict majority holds the right copy: only the odd ones out need replacing."""
        return bool(self.ranks) and not self.ambiguous

    def describe(self, nodes: list[str]) -> str:
        named = ", ".join(f"rank {r} on {nodes[r]}" for r in self.ranks)
        how = "no majority: every replica named" if self.ambiguous else "outvoted"
        return (
            f"parameter checksums of data-parallel replicas differ at step {self.step}: "
            f"{named} ({how})"
        )


def replicas_are_equal(dims: ParallelDims, zero_stage: int) -> bool:
    """Whether data-parallel peers hold equal parameters (and so can be compared)."""
    return zero_stage == 0 and dims.dp > 1


def param_checksum(parameters: Iterable[torch.Tensor]) -> torch.Tensor:
    """The int64 sum of the bit patterns of this rank's parameter shards (on the device)."""
    total: torch.Tensor | None = None
    for p in parameters:
        local = local_shard(p)
        bits = local.detach().contiguous().view(INT_VIEWS.get(local.dtype, torch.int64))
        part = bits.to(torch.int64).sum()
        total = part if total is None else total + part
    assert total is not None, "a rank with no parameters"
    return total


def replica_key(dims: ParallelDims) -> int:
    """Ranks with the same key and different dp coordinates must hold equal parameters."""
    key = 0
    for name in ("pp", "tp", "cp"):
        mesh = dims.mesh(name)
        key = key * mesh.size() + mesh.get_local_rank()
    return key


def odd_ones(checksums: list[int], keys: list[int]) -> tuple[list[int], bool]:
    """The ranks whose checksum differs from their replica set's majority (pure), and
    whether some set had no strict majority (then all of its ranks are returned)."""
    sets: dict[int, list[int]] = defaultdict(list)
    for rank, key in enumerate(keys):
        sets[key].append(rank)
    odd, ambiguous = [], False
    for ranks in sets.values():
        counts = Counter(checksums[r] for r in ranks)
        if len(counts) == 1:
            continue
        value, votes = counts.most_common(1)[0]
        if votes * 2 > len(ranks):
            odd += [r for r in ranks if checksums[r] != value]
        else:
            odd += ranks
            ambiguous = True
    return sorted(odd), ambiguous


def compare_replicas(
    step: int,
    parameters: Iterable[torch.Tensor],
    key: int,
    device: torch.device,
    across_groups: Callable[[torch.Tensor], GroupValues | None] | None = None,
    within_group: bool = True,
) -> Mismatch | None:
    """Every rank, on the same step: gather every rank's checksum and judge them.

    `within_group`: compare data-parallel peers of this process group (replicas_are_equal).
    `across_groups` (replica groups, worker/cross_group.py) gives every group's checksum at
    this rank's mesh coordinate: a group outvoted there, or in a set without a majority,
    names its rank. A mismatch inside this group stops it, and so does one across groups
    without a majority (every group stops: none is trusted); a group in the majority that
    outvoted another returns None and trains on (the outvoted group stops by itself)."""
    checksum = param_checksum(parameters)
    # 0: agrees with the other groups (or none to ask); 1: outvoted; 2: no majority;
    # 3: another group was outvoted here (this rank is in the majority: it trains on).
    verdict = 0
    seen = across_groups(checksum) if across_groups is not None else None
    if seen is not None:
        odd, ambiguous = odd_ones(seen.values, [0] * len(seen.values))
        if odd and any(seen.healed):
            # A group that healed holds a copy of its source, not a vote of its own: a
            # corrupt source and its copy could outvote a sound group. No majority then.
            odd, ambiguous = list(range(len(seen.values))), True
        verdict = (2 if ambiguous else 1) if seen.mine in odd else (3 if odd else 0)
    mine_t = torch.stack(
        [checksum, torch.tensor(key, device=device), torch.tensor(verdict, device=device)]
    )
    gathered = [torch.empty_like(mine_t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine_t)  # sync: one small collective every sdc_check_every steps
    rows: list[list[int]] = torch.stack(gathered).tolist()  # host sync: a report step's
    ranks: list[int] = []
    ambiguous = False
    if within_group:
        ranks, ambiguous = odd_ones([int(r[0]) for r in rows], [int(r[1]) for r in rows])
    verdicts = [int(r[2]) for r in rows]
    ranks = sorted(set(ranks) | {r for r, v in enumerate(verdicts) if v in (1, 2)})
    ambiguous = ambiguous or 2 in verdicts
    if ranks:
        return Mismatch(step, ranks, ambiguous)
    return None
