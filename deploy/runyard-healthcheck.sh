#!/bin/sh
# Slurm's HealthCheckProgram (slurm.conf: HealthCheckProgram=<this file>,
# HealthCheckInterval=300). Runs runyard's node checks once; a node that fails them is
# drained by Slurm with reason "runyard: healthcheck: ...", which `runyard node resume`
# may lift once the node is repaired. Never blocks: it reads files and NVML only.
ENV_FILE=${RUNYARD_AGENT_ENV:-/etc/runyard/agent.env}
if [ -r "$ENV_FILE" ]; then set -a; . "$ENV_FILE"; set +a; fi
NODE=${SLURMD_NODENAME:-${RUNYARD_NODE:-$(hostname -s)}}
exec "${RUNYARD_HOME:-/shared/runyard}/venv/bin/python" -m worker.agent.healthcheck \
  --node "$NODE" --kernel-log "${RUNYARD_KERNEL_LOG:-/var/log/kern.log}" \
  --state-dir "${RUNYARD_AGENT_STATE_ROOT:-/var/lib/runyard-agent}/$NODE" \
  ${RUNYARD_EXPECT_GPUS:+--expect-gpus "$RUNYARD_EXPECT_GPUS"}
