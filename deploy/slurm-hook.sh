#!/bin/sh
# Slurm's Prolog and Epilog (slurm.conf: Prolog=<dir>/slurm-prolog.sh,
# Epilog=<dir>/slurm-epilog.sh, both links to this file): queue "job started/ended on this
# node" in the node agent's outbox, which delivers it to runyard. Always exits 0: a failing
# prolog would drain the node, and runyard's bookkeeping must never cost a job.
# Runs as root: agent.env is read as data by agent-env.sh (beside this file), never sourced.
ENV_FILE=${RUNYARD_AGENT_ENV:-/etc/runyard/agent.env}
HOOKS=$(dirname -- "$(readlink -f -- "$0")")
if [ ! -r "$HOOKS/agent-env.sh" ]; then
  echo "runyard: $HOOKS/agent-env.sh is missing: event not queued" >&2
  exit 0
fi
. "$HOOKS/agent-env.sh"
read_agent_env "$ENV_FILE" || { echo "runyard: event not queued" >&2; exit 0; }
case "$(basename "$0")" in *epilog*) PHASE=epilog ;; *) PHASE=prolog ;; esac
NODE=${SLURMD_NODENAME:-${RUNYARD_NODE:-$(hostname -s)}}
"${RUNYARD_HOME:-/shared/runyard}/venv/bin/python" -m worker.agent.slurm_hook "$PHASE" \
  --node "$NODE" --state-dir "${RUNYARD_AGENT_STATE_ROOT:-/var/lib/runyard-agent}/$NODE" || true
exit 0
