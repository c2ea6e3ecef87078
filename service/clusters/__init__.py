"""Several Slurm clusters under one service (issue 41): which cluster a run belongs on.

`failover.py` decides when a run leaves a cluster that cannot run it, where it goes, and
what the move costs. Pure functions over plain values, as `recovery.paths` is, so that the
reconciler and the failure simulation (sim/) ask the same question the same way.
"""
