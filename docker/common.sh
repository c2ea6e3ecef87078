#!/usr/bin/env bash
# Shared by the container entry points: Slurm's configuration and munge's key.
set -euo pipefail

NODES=${RUNYARD_COMPOSE_NODES:-3}
LEAF_SIZE=${RUNYARD_COMPOSE_LEAF_SIZE:-2}
SLURM_STATE=/var/lib/runyard/slurm
SHARED_KEY=/etc/munge-shared/munge.key
TOKENS=/var/lib/runyard/state/tokens
TLS=/var/lib/runyard/state/tls

# The same slurm_templates/ that `runyard dev up` renders, for one host per node.
render_slurm_conf() {
  mkdir -p /etc/slurm "$SLURM_STATE"/{slurmctld,slurmd,run,log,dev}
  runyard dev render --containers --nodes "$NODES" --leaf-size "$LEAF_SIZE" \
    --state-dir "$SLURM_STATE" --out /etc/slurm >/dev/null
  # GRES File= entries must name character devices (see gres.conf.j2): made like /dev/nvidiaN.
  for i in 0 1 2 3 4 5 6 7; do
    [[ -e "$SLURM_STATE/dev/nvidia$i" ]] || mknod -m 666 "$SLURM_STATE/dev/nvidia$i" c 195 "$i"
  done
}

# One key for the whole cluster: the controller creates it in a shared volume, every other
# container waits for it, then runs its own munged with a copy.
start_munge() {
  local create=${1:-no}
  if [[ "$create" == create && ! -s "$SHARED_KEY" ]]; then
    mungekey --create --keyfile "$SHARED_KEY.tmp" && mv "$SHARED_KEY.tmp" "$SHARED_KEY"
  fi
  for _ in $(seq 1 120); do [[ -s "$SHARED_KEY" ]] && break; sleep 1; done
  [[ -s "$SHARED_KEY" ]] || { echo "no munge key in $SHARED_KEY after 120 s" >&2; exit 1; }
  install -o munge -g munge -m 0400 "$SHARED_KEY" /etc/munge/munge.key
  install -d -o munge -g munge -m 0755 /run/munge
  runuser -u munge -- munged
}

wait_for_file() {
  for _ in $(seq 1 180); do [[ -s "$1" ]] && return 0; sleep 1; done
  echo "gave up waiting for $1" >&2
  exit 1
}
