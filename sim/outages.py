"""Whole-cluster outages: how often a cluster cannot run a run at all, and for how long.

The rates and durations are Google's published record of a new cluster's first year (Jeff
Dean, "Designs, Lessons and Advice from Building Large Distributed Systems", LADIS 2009
keynote; the same figures in his Google I/O 2008 talk), for a cluster of about 1,800
machines: about 0.5 overheating events a year (most machines powered down within 5
minutes, 1 to 2 days to recover) and about 1 power distribution unit failure (500 to 1,000
machines gone at once, back in about 6 hours). Either leaves a run that fills its cluster
(the simulated run holds all but its 1.5% of spares) without the nodes it needs: 1.5 events
per cluster-year, a mean of 16 hours each, or 24 hours down a year (0.27% of the time).

Not counted: that list's router failures (3 a year, traffic pulled for an hour) cut a
cluster from the outside, not its jobs from each other; the runs inside keep training, and
the failover rule keeps a run whose ranks still report (service/clusters/failover.py).

Stated assumptions: an overheating takes the controller's host down with the nodes (the
service sees it silent), a PDU failure does not (the service sees too few healthy nodes);
the checkpoint's storage is on power and network of its own and stays readable; every
cluster fails independently of the others, at the same rate.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

HOURS_PER_YEAR = 365 * 24


@dataclass(frozen=True)
class OutageCause:
    name: str
    per_cluster_year: float  # LADIS 2009, "typical first year for a new cluster"
    min_h: float  # duration, uniform between these
    max_h: float
    controller_down: bool  # the service cannot reach the controller (else: nodes down)


CAUSES: tuple[OutageCause, ...] = (
    OutageCause("overheating", 0.5, 24.0, 48.0, controller_down=True),
    OutageCause("PDU failure", 1.0, 6.0, 6.0, controller_down=False),
)


@dataclass(frozen=True)
class Outage:
    at_s: float
    cluster: int  # the index of the cluster it takes out
    until_s: float
    cause: OutageCause


def draw_outages(seed: int, *, days: float, clusters: int, scale: float) -> list[Outage]:
    """Every whole-cluster outage of `clusters` clusters over `days`, at `scale` x the
    published rate, in time order. Each cluster draws from a stream of its own (seeded by
    `seed` and its index), so cluster 0 has the same outages whether or not a second
    cluster is simulated: a run with failover and one without meet the same ones."""
    horizon = days * 86400
    out: list[Outage] = []
    for cluster in range(clusters if scale > 0 else 0):
        rng = random.Random(f"outages:{seed}:{cluster}")
        for cause in CAUSES:
            rate_per_s = cause.per_cluster_year * scale / (HOURS_PER_YEAR * 3600)
            t = 0.0
            while True:
                t += rng.expovariate(rate_per_s)
                if t >= horizon:
                    break
                length = rng.uniform(cause.min_h, cause.max_h) * 3600
                out.append(Outage(t, cluster, t + length, cause))
    return sorted(out, key=lambda o: (o.at_s, o.cluster))
