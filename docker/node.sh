#!/usr/bin/env bash
# One compute node: munged, the node's health agent, and slurmd in the foreground.
source /opt/runyard/docker/common.sh
NODE=${1:?usage: node.sh gpuNNN}
render_slurm_conf
start_munge
wait_for_file "$TOKENS/$NODE.token"
wait_for_file "$TLS/ca.pem"
mkdir -p "/var/lib/runyard/agent/$NODE"
touch /var/log/kern.log
RUNYARD_AGENT_TOKEN=$(cat "$TOKENS/$NODE.token") RUNYARD_CA=$TLS/ca.pem python -m worker.agent \
  --node "$NODE" --service-url "${RUNYARD_PUBLIC_URL:-https://service:8000}" \
  --kernel-log /var/log/kern.log --state-dir "/var/lib/runyard/agent/$NODE" \
  --run-logs "/var/lib/runyard/state/jobs/**/*.out" &
exec slurmd -D -N "$NODE" -f /etc/slurm/slurm.conf
