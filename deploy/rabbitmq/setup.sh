#!/bin/sh
# Least privilege in RabbitMQ, with rabbitmqctl on the broker's host (idempotent):
#
# - a virtual host of the service, EO_VHOST (default eo);
# - the service's user (EO_SERVICE_USER, default eo-service): every right on that virtual
#   host only, no management tag, nothing elsewhere;
# - an outside producers' user (EO_PRODUCER_USER, default eo-producer): may publish to the
#   gateways' inbound exchanges (`<gateway>.in`, for each name in EO_GATEWAYS) and nothing
#   else: no queue of the service, no default exchange (which routes to any queue), no
#   reading, no declaring;
# - the dead-letter queues' byte bound as a policy (EO_DEAD_LETTER_MAX_BYTES, default 256 MiB,
#   reject-publish), which also bounds queues declared before it;
# - at-least-once dead-lettering on the work queues (a policy): a message the broker
#   dead-letters past the delivery limit waits while the dead-letter queue is full, where the
#   default (at-most-once) would drop it.
#
# Passwords come from EO_SERVICE_PASSWORD and EO_PRODUCER_PASSWORD (required), given to
# rabbitmqctl on its standard input, never on a command line. Example:
#   EO_GATEWAYS=gateway EO_SERVICE_PASSWORD=... EO_PRODUCER_PASSWORD=... \
#     sh deploy/rabbitmq/setup.sh
set -eu
vhost=${EO_VHOST:-eo}
service=${EO_SERVICE_USER:-eo-service}
producer=${EO_PRODUCER_USER:-eo-producer}
gateways=${EO_GATEWAYS:?set EO_GATEWAYS: the gateway endpoints, space-separated}
max_bytes=${EO_DEAD_LETTER_MAX_BYTES:-268435456}
ctl="rabbitmqctl -q"

user() {  # user <name> <password>: create, or reset the password of, a user without tags
  if $ctl list_users | cut -f1 | grep -qx "$1"; then
    printf '%s' "$2" | $ctl change_password "$1" >/dev/null
  else
    printf '%s' "$2" | $ctl add_user "$1" >/dev/null
  fi
  $ctl set_user_tags "$1"
}

$ctl list_vhosts | grep -qx "$vhost" || $ctl add_vhost "$vhost"
user "$service" "${EO_SERVICE_PASSWORD:?set EO_SERVICE_PASSWORD}"
user "$producer" "${EO_PRODUCER_PASSWORD:?set EO_PRODUCER_PASSWORD}"
$ctl set_permissions -p "$vhost" "$service" '.*' '.*' '.*'
exchanges=$(printf '%s\n' $gateways | sed 's/[.]/\\./g; s/$/\\.in/' | paste -sd'|' -)
$ctl set_permissions -p "$vhost" "$producer" '^$' "^($exchanges)\$" '^$'
$ctl set_policy -p "$vhost" --priority 1 --apply-to queues eo-dead-letters '\.dlq$' \
  "{\"max-length-bytes\": $max_bytes, \"overflow\": \"reject-publish\"}"
$ctl set_policy -p "$vhost" --priority 1 --apply-to queues eo-work-queues \
  '^(?!.*\.(dlq|retry\.[0-9]+(ms)?)$)' \
  '{"dead-letter-strategy": "at-least-once", "overflow": "reject-publish"}'
echo "rabbitmq: vhost $vhost, users $service (all on $vhost), $producer (publish to $exchanges)"
