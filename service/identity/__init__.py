"""Who a run runs as: the one layer that decides a job's Unix user and Slurm account, and
whose rights a file operation uses, decided in one place so that no path forgets it. Every
path that submits a job or touches a user's files goes through `OwnerGate`.

service.py links users and gives a run its owner; gate.py's `OwnerGate` runs as_owner.py,
the owner's program (the one the sudoers rule names), as that owner; python_probe.py checks
a spec's interpreter as them; owner_folders.py says where a run's files live in its
owner's folders."""
