#!/usr/bin/env bash
# The runyard service: migrate the database (the prestart step), mint the tokens the
# agents and the first admin use, then serve the API with its reconciler.
source /opt/runyard/docker/common.sh
render_slurm_conf
start_munge
alembic -c /opt/runyard/alembic.ini upgrade head
mkdir -p "$TOKENS"
python -m service.auth.bootstrap --user admin --team ops --role admin --out "$TOKENS/admin.token"
for i in $(seq 1 "$NODES"); do
  node=$(printf 'gpu%03d' "$i")
  python -m service.auth.bootstrap --user "agent-$node" --team ops --role agent \
    --node "$node" --out "$TOKENS/$node.token"
done
exec uvicorn service.app:create_app --factory --host 0.0.0.0 --port 8000
