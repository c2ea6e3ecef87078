#!/usr/bin/env bash
# Install what runyard needs on a Debian machine (as root): Slurm (with slurmdbd and
# MariaDB for accounting), munge and Postgres from
# Debian's packages if absent, then the project and torch==2.13.0 into .venv. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

missing=()
for bin in slurmctld slurmd sbatch munged; do
  command -v "$bin" >/dev/null 2>&1 || { missing+=(slurmctld slurmd slurm-client munge); break; }
done
command -v pg_ctlcluster >/dev/null 2>&1 || missing+=(postgresql)
# Slurm accounting on the dev cluster (`sacct`): slurmdbd and a MariaDB for it.
command -v slurmdbd >/dev/null 2>&1 || missing+=(slurmdbd)
command -v mariadbd >/dev/null 2>&1 || missing+=(mariadb-server)
# Headless Chromium opens `runyard run report` pages in the tests.
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# The compose file is validated offline by Debian's docker-compose (no engine needed).
command -v docker-compose >/dev/null 2>&1 || missing+=(docker-compose)
python3 -c "import ensurepip" >/dev/null 2>&1 || missing+=(python3-venv)
# promtool checks and unit-tests the alert rules (deploy/prometheus/) in `make test`.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# The service (not root) submits as each run's owner through one sudoers rule.
command -v sudo >/dev/null 2>&1 || missing+=(sudo)
if ((${#missing[@]})); then
  echo "bootstrap: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "bootstrap: creating $VENV"
  python3 -m venv "$VENV"
fi
echo "bootstrap: installing runyard[worker,dev,tracking] (torch==2.13.0) into $VENV"
"$VENV/bin/pip" install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
# torch is pinned in pyproject.toml (runyard[worker]); pip takes the CPU build from the
# local wheel cache where one exists. runyard-client (runyard-client/: the library teams'
# own scripts import, a distribution of its own that installs alone) is on no index: it is
# installed in the same call, which satisfies runyard's dependency on it.
"$VENV/bin/pip" install -q -e ./runyard-client -e '.[worker,dev,tracking]' 2>&1 \
  | grep -v "is ignored" || true
# The dev cluster's MLflow tracking server (`runyard dev up --with mlflow`, and the tracker
# tests) runs from a virtual environment of its own: the full `mlflow` package pins
# pyarrow<26 and graphene 3 (graphql-core<3.3), which conflict with datasets' pyarrow and
# schemathesis' graphql-core here; the service needs only its client (mlflow-skinny).
MLFLOW_VENV=${MLFLOW_VENV:-.runyard/mlflow-venv}
if [[ ! -x "$MLFLOW_VENV/bin/mlflow" ]]; then
  echo "bootstrap: installing the MLflow tracking server into $MLFLOW_VENV"
  python3 -m venv "$MLFLOW_VENV"
  "$MLFLOW_VENV/bin/pip" install -q 'mlflow==3.17.2' 'psycopg[binary]>=3.1' 2>&1 \
    | grep -v "is ignored" || true
fi
"$VENV/bin/python" -c "import torch, torchft, mlflow, wandb, tensorboard, service, worker, client, runyard_client" \
  || { echo "bootstrap: the install failed; see pip's output above" >&2; exit 1; }
