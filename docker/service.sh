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
# HTTPS with a CA of the compose cluster's own, in the shared volume: the nodes' agents and
# the runs' workers verify the service (https://service:8000) with its ca.pem.
python -m client.devcluster.tls "$TLS" --name service >/dev/null
export RUNYARD_TLS_CERT_FILE=$TLS/server.pem RUNYARD_TLS_KEY_FILE=$TLS/server-key.pem
export RUNYARD_CA=$TLS/ca.pem
exec python -m service.serve
