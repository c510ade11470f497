#!/bin/sh
# The compose stack's RabbitMQ: the image's own start, then (once it runs) setup.sh's
# virtual host, least-privilege users and dead-letter policy; then it waits on the server.
set -eu
docker-entrypoint.sh rabbitmq-server &
server=$!
until rabbitmq-diagnostics -q check_running >/dev/null 2>&1; do
  kill -0 "$server" 2>/dev/null || exit 1
  sleep 1
done
sh /eo/rabbitmq/setup.sh
wait "$server"
