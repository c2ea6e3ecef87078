"""What fails, how often, and what the node's agent (or a rank) reports when it does.

The rates and the cause mix are Llama 3's published record: "The Llama 3 Herd of Models"
(Meta, 2024), section 3.3.4 and Table 5: 419 unexpected interruptions in 54 days of
pre-training on 16,384 H100 GPUs (planner.reliability.DEFAULT_FAILURES_PER_GPU_HOUR, about
2.0e-5 per GPU-hour), by root cause. Each cause is mapped to the signal runyard would see
first, which the service's own classification table then turns into an action: the
simulation never decides by cause, only by the signal, as the service does.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from planner import reliability

# A leaf switch holds 16 nodes (the topology; a DGX SuperPOD scalable unit's leaf
# pairs serve 16-32 nodes).
NODES_PER_LEAF = 16


class Report(StrEnum):
    """How a failure reaches the service."""

    AGENT_XID = "agent_xid"  # the node's agent reads an Xid in the kernel log
    RANK_NCCL = "rank_nccl"  # a rank's collective fails and the worker reports it
    HEARTBEAT = "heartbeat"  # the node goes silent: the service's heartbeat check
    HANG = "hang"  # steps stop: the service's hang check


@dataclass(frozen=True)
class Cause:
    name: str
    share: float  # of all interruptions, Llama 3 Table 5
    report: Report
    signal: str  # the classification table's key for what is reported
    broken: bool  # the node stays broken until repaired (a restart on it fails again)


# Llama 3 Table 5 (shares of the 419 interruptions). The signal is what the first report
# would carry; NVIDIA's Xid catalog gives the codes (service/recovery/classification.py).
CAUSES: tuple[Cause, ...] = (
    Cause("faulty GPU", 0.301, Report.AGENT_XID, "xid:79", True),  # fell off the bus
    Cause("GPU HBM3 memory", 0.172, Report.AGENT_XID, "xid:48", True),  # double-bit ECC
    # A rank raises: its peers' collectives fail with ncclRemoteError.
    Cause("software bug", 0.129, Report.RANK_NCCL, "nccl:remote_error", False),
    # A flapping link or cable: NCCL reports a system error; a restart re-forms the rings.
    Cause("network switch/cable", 0.084, Report.RANK_NCCL, "nccl:system_error", False),
    # The host is taken away (kernel panic, BMC-forced reboot): the agent falls silent.
    Cause("host maintenance", 0.076, Report.HEARTBEAT, "heartbeat:lost", True),
    Cause("GPU SRAM memory", 0.045, Report.AGENT_XID, "xid:95", True),  # uncontained ECC
    Cause("GPU system processor", 0.041, Report.AGENT_XID, "xid:119", True),  # GSP timeout
    Cause("NIC", 0.017, Report.RANK_NCCL, "nccl:system_error", False),
    # A collective stalls: the service's hang check fires before NCCL's watchdog would.
    Cause("NCCL watchdog timeout", 0.017, Report.HANG, "hang:no_progress", False),
    # Silent data corruption surfaces as a loss spike or NaN: the rank stops with an error.
    Cause("silent data corruption", 0.014, Report.RANK_NCCL, "nccl:remote_error", False),
    # The rest of Table 5 (thermal interface and sensors, SSD, power supply, chassis, IO
    # board, CPU, system memory, dependencies): the host stops, its agent falls silent.
    Cause("other host hardware", 1.0 - 0.896, Report.HEARTBEAT, "heartbeat:lost", True),
)

# Correlated failures: a whole leaf switch (and the 16 nodes behind it) goes at once. Llama 3
# does not count them apart; we assume one in ten of its "network switch/cable" interruptions
# is a whole switch, i.e. 0.84% of interruptions, each taking its 16 nodes' heartbeats with it
# (a top-of-rack switch carries the management traffic too). An assumption, stated.
LEAF_SHARE = 0.084 / 10
LEAF_CAUSE = Cause("leaf switch", LEAF_SHARE, Report.HEARTBEAT, "heartbeat:lost", True)
# Repairs. A drained node is back after an exponential time of mean repair_window_h (24 h:
# the same figure that sizes the spare pool, planner.reliability.ReliabilityAssumptions);
# a leaf switch is swapped in 4 h (a field-replaceable unit on site: an assumption).
LEAF_REPAIR_H = 4.0


@dataclass(frozen=True)
class Failure:
    at_s: float
    cause: Cause
    slot: int | None  # a single-node failure: the node now at this place in the run
    leaf: int | None  # a whole-leaf failure: this leaf switch of the cluster


def failure_rate_per_s(num_gpus: int, scale: float) -> float:
    """Interruptions per second of the whole run at `scale` x Llama 3's rate."""
    return reliability.DEFAULT_FAILURES_PER_GPU_HOUR * scale * num_gpus / 3600


def draw_failures(
    rng: random.Random,
    *,
    days: float,
    num_nodes: int,
    gpus_per_node: int,
    num_leaves: int,
    scale: float,
) -> list[Failure]:
    """Every failure of a `days`-long run on `num_nodes` nodes, in time order.

    Single-node failures are a Poisson process at the run's rate (less the leaf share), the
    run's node uniform; whole-leaf failures another, the cluster's leaf uniform."""
    horizon = days * 86400
    rate = failure_rate_per_s(num_nodes * gpus_per_node, scale)
    weights = [c.share for c in CAUSES]
    out: list[Failure] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate * (1 - LEAF_SHARE))
        if t >= horizon:
            break
        cause = rng.choices(CAUSES, weights)[0]
        out.append(Failure(t, cause, rng.randrange(num_nodes), None))
    t = 0.0
    while num_leaves:
        t += rng.expovariate(rate * LEAF_SHARE)
        if t >= horizon:
            break
        out.append(Failure(t, LEAF_CAUSE, None, rng.randrange(num_leaves)))
    return sorted(out, key=lambda f: f.at_s)


def repair_s(rng: random.Random, cause: Cause, repair_window_h: float) -> float:
    """How long a drained node of this cause stays out."""
    mean_h = LEAF_REPAIR_H if cause is LEAF_CAUSE else repair_window_h
    return rng.expovariate(1 / (mean_h * 3600))
