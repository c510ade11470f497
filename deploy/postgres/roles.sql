-- Least privilege in PostgreSQL: the migrations' role owns the schema, the service's role
-- reads and writes rows and nothing more (no DDL, no TRUNCATE, no other database), and an
-- optional bulk producer's role may only insert inbox rows for its gateways.
--
--   psql -v owner=eo_owner -v owner_password=... -v app=eo_app -v app_password=... \
--        -v database=eo [-v producer=eo_ingest -v producer_password=... -v gateways=gateway] \
--        -f deploy/postgres/roles.sql
--
-- Run it as a superuser (deploy/postgres/init-roles.sh does it at the first start of the
-- compose stack), and again after `eo migrate` when there is a producer: its rights are on
-- tables the migrations create. Idempotent: roles that exist get their password reset. Run
-- `eo migrate` with EO_DATABASE_DSN naming the owner, and the processes with the app role:
-- the default privileges below give the app role its rights on every table the owner's
-- migrations create. What no grant can say is the migrations' own (revision 0012): a token
-- row cannot be rewritten by anyone, and an inbox row is inserted only by a producer, in its
-- own name, for a gateway it is granted (the app role is granted none).
\set ON_ERROR_STOP on

SELECT format('CREATE ROLE %I LOGIN', :'owner')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'owner') \gexec
SELECT format('CREATE ROLE %I LOGIN', :'app')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'app') \gexec
ALTER ROLE :"owner" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'owner_password';
ALTER ROLE :"app" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'app_password';

ALTER DATABASE :"database" OWNER TO :"owner";
REVOKE ALL ON DATABASE :"database" FROM PUBLIC;
GRANT CONNECT ON DATABASE :"database" TO :"app";

\connect :"database"
ALTER SCHEMA public OWNER TO :"owner";
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO :"app";
-- tables that exist already (a database migrated before the roles were split)
SELECT format('ALTER TABLE public.%I OWNER TO %I', tablename, :'owner')
  FROM pg_tables WHERE schemaname = 'public' \gexec
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO :"app";
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO :"app";
-- tables and sequences the owner's migrations create from now on
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"app";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner" IN SCHEMA public
  GRANT USAGE, SELECT ON SEQUENCES TO :"app";

\if :{?producer}
-- The bulk producer (the Spark ingest, `eo pipeline ingest`): insert inbox rows of its
-- gateways in its own name (row-level security, revision 0012), stage them in a schema of
-- its own (the first of its search_path), nothing else: no protocol table, no relaying.
SELECT format('CREATE ROLE %I LOGIN', :'producer')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'producer') \gexec
ALTER ROLE :"producer" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE
  PASSWORD :'producer_password';
GRANT CONNECT ON DATABASE :"database" TO :"producer";
GRANT USAGE ON SCHEMA public TO :"producer";
SELECT format('CREATE SCHEMA IF NOT EXISTS %I AUTHORIZATION %I', :'producer', :'producer')
 \gexec
-- (the keys it may read, of its own rows only: a re-run's ON CONFLICT checks them)
SELECT format('GRANT INSERT (endpoint, message_id, type, body, received_at), '
              'SELECT (endpoint, producer, message_id) ON public.eo_inbox TO %I',
              :'producer')
 WHERE to_regclass('public.eo_inbox') IS NOT NULL \gexec
SELECT format('GRANT SELECT ON public.eo_inbox_producer TO %I', :'producer')
 WHERE to_regclass('public.eo_inbox_producer') IS NOT NULL \gexec
SELECT format('INSERT INTO public.eo_inbox_producer (role, endpoint) VALUES (%L, %L) '
              'ON CONFLICT DO NOTHING', :'producer', gateway)
  FROM unnest(string_to_array(:'gateways', ' ')) AS g(gateway)
 WHERE to_regclass('public.eo_inbox_producer') IS NOT NULL AND gateway <> '' \gexec
SELECT to_regclass('public.eo_inbox_producer') IS NULL AS inbox_missing \gset
\if :inbox_missing
\echo 'no inbox tables yet: run `eo migrate`, then this script again for the producer'
\endif
\endif
