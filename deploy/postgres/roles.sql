-- Least privilege in PostgreSQL: the migrations' role owns the schema, the service's role
-- reads and writes rows and nothing more (no DDL, no TRUNCATE, no other database).
--
--   psql -v owner=eo_owner -v owner_password=... -v app=eo_app -v app_password=... \
--        -v database=eo -f deploy/postgres/roles.sql
--
-- Run it once as a superuser (deploy/postgres/init-roles.sh does it at the first start of the
-- compose stack). Idempotent: roles that exist get their password reset. Then run
-- `eo migrate` with EO_DATABASE_DSN naming the owner, and the processes with the app role:
-- the default privileges below give the app role its rights on every table the owner's
-- migrations create.
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
