#!/bin/sh
# Slurm's HealthCheckProgram (slurm.conf: HealthCheckProgram=<this file>,
# HealthCheckInterval=300). Runs runyard's node checks once; a node that fails them is
# drained by Slurm with reason "runyard: healthcheck: ...", which `runyard node resume`
# may lift once the node is repaired. Never blocks: it reads files and NVML only.
# Runs as root: agent.env is read as data by agent-env.sh (beside this file), never sourced,
# and the check keeps its place in the kernel log in a folder only root writes
# (RUNYARD_HEALTHCHECK_STATE_ROOT), not in the agent's.
ENV_FILE=${RUNYARD_AGENT_ENV:-/etc/runyard/agent.env}
HOOKS=$(dirname -- "$(readlink -f -- "$0")")
if [ ! -r "$HOOKS/agent-env.sh" ]; then
  echo "runyard: $HOOKS/agent-env.sh is missing: no checks run" >&2
  exit 2
fi
. "$HOOKS/agent-env.sh"
read_agent_env "$ENV_FILE" || { echo "runyard: no checks run" >&2; exit 2; }
NODE=${SLURMD_NODENAME:-${RUNYARD_NODE:-$(hostname -s)}}
exec "${RUNYARD_HOME:-/shared/runyard}/venv/bin/python" -m worker.agent.healthcheck \
  --node "$NODE" --kernel-log "${RUNYARD_KERNEL_LOG:-/var/log/kern.log}" \
  --state-dir "${RUNYARD_HEALTHCHECK_STATE_ROOT:-/var/lib/runyard-healthcheck}/$NODE" \
  ${RUNYARD_EXPECT_GPUS:+--expect-gpus "$RUNYARD_EXPECT_GPUS"}
