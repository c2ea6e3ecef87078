#!/usr/bin/env bash
# The Slurm controller: munged and slurmctld in the foreground.
source /opt/runyard/docker/common.sh
render_slurm_conf
start_munge create
exec slurmctld -D -f /etc/slurm/slurm.conf
