#!/bin/sh
# Start the runyard health agent of one Slurm node. runyard-agent.service runs it; so does a
# host without systemd (docs/install.md step 7). Its one argument is the node's agent.env
# (default /etc/runyard/agent.env, mode 0600: it holds the node's token).
set -eu
ENV_FILE=${1:-${RUNYARD_AGENT_ENV:-/etc/runyard/agent.env}}
# KEY=value lines read literally, as systemd's EnvironmentFile= reads them (a database URL's
# "&" is no shell operator here); comments and blank lines skipped, one pair of quotes dropped.
while IFS== read -r key value || [ -n "$key" ]; do
  case $key in "" | \#*) continue ;; esac
  case $value in \"*\") value=${value#\"} value=${value%\"} ;; esac
  export "$key=$value"
done < "$ENV_FILE"
HOME_DIR=${RUNYARD_HOME:-$(cd "$(dirname "$0")/../.." && pwd)}
STATE=${RUNYARD_AGENT_STATE_ROOT:-/var/lib/runyard-agent}/$RUNYARD_NODE
mkdir -p "$STATE"
exec "$HOME_DIR/venv/bin/python" -m worker.agent --node "$RUNYARD_NODE" \
  --service-url "$RUNYARD_URL" --kernel-log "${RUNYARD_KERNEL_LOG:-/var/log/kern.log}" \
  --state-dir "$STATE" ${RUNYARD_RUN_LOGS:+--run-logs "$RUNYARD_RUN_LOGS"}
