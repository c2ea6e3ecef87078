"""Who a run runs as: the one layer that decides a job's Unix user and Slurm account, and
whose rights a file operation uses, decided in one place so that no path forgets it. Every
path that submits a job or touches a user's files goes through `OwnerGate`."""
