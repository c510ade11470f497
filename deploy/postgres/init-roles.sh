#!/bin/sh
# The postgres image runs this once, at the first start of an empty data directory
# (/docker-entrypoint-initdb.d), as its superuser: the owner and app roles of roles.sql.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
  -v owner=eo_owner -v owner_password="$EO_OWNER_PASSWORD" \
  -v app=eo_app -v app_password="$EO_APP_PASSWORD" \
  -v database="$POSTGRES_DB" \
  -f /eo/postgres/roles.sql
