"""Several Slurm clusters under one service (issue 41): which cluster a run belongs on.

`registry.py` lists the configured clusters; `reachability.py` keeps since when each one's
controller has not answered the reconciler; `choice.py` picks the cluster an unpinned run
goes to from each cluster's plan; `stranded.py` lists the runs whose cluster cannot run
them; `failover.py` decides when such a run leaves, where it goes, and what the move costs.
`choice.py` and `failover.py` are pure functions over plain values, as `recovery.paths` is,
so that the service and the failure simulation (sim/) ask the same question the same way.
"""
