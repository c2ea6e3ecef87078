#!/bin/sh
# Start the runyard service (API + reconciler): migrate the database to the code's head, then
# serve. runyard.service runs it; so does a host without systemd (docs/install.md step 5).
# Its one argument is the settings file (default /etc/runyard/runyard.env); the Python is the
# virtualenv beside the source: <RUNYARD_HOME>/venv next to <RUNYARD_HOME>/src.
set -eu
ENV_FILE=${1:-${RUNYARD_ENV_FILE:-/etc/runyard/runyard.env}}
SRC=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${RUNYARD_SERVICE_PYTHON:-$(dirname "$SRC")/venv/bin/python}
# KEY=value lines read literally, as systemd's EnvironmentFile= reads them (a database URL's
# "&" is no shell operator here); comments and blank lines skipped, one pair of quotes dropped.
while IFS== read -r key value || [ -n "$key" ]; do
  case $key in "" | \#*) continue ;; esac
  case $value in \"*\") value=${value#\"} value=${value%\"} ;; esac
  export "$key=$value"
done < "$ENV_FILE"
cd "$SRC"
# The prestart step: the database at the migrations' head before the API answers.
"$PYTHON" -m alembic -c "$SRC/alembic.ini" upgrade head
# The W&B SDK reuses the wandb-core named in WANDB_SERVICE, which it sets for its own
# children: one inherited from whatever started us (a shell or a test session that used
# wandb) is another process's, often another user's, and every export to W&B then failed to
# connect. The service starts its own.
unset WANDB_SERVICE
# service/serve.py: uvicorn on RUNYARD_HOST:RUNYARD_PORT, HTTPS with RUNYARD_TLS_CERT_FILE
# and _KEY_FILE (plain HTTP it serves on a loopback address only).
exec "$PYTHON" -m service.serve
