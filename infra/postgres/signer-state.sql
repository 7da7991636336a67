-- One deployer's signer state on the deployment's PostgreSQL (signer_state_backend = "postgresql"):
-- its own login role and its own database of the same name, which no other role may connect to.
-- Terraform cannot create either (its state would hold the password, and it has no path into the
-- private subnets); run this once per deployer, as the RDS master user, with the name from
-- `terraform output signer_state_postgres` and the password you put into that deployer's secret:
--
--   psql "host=<postgres endpoint> port=5432 dbname=countersign user=countersign sslmode=require" \
--        -v name=countersign_signer_deployer_a -v password="$PASSWORD" -f infra/postgres/signer-state.sql
--
-- The signer's replicas then create their schema (countersign_signer) and run their migrations
-- inside that database themselves. tests/infra/test_signer_postgres.py runs this file and those
-- migrations against a real PostgreSQL and checks that another deployer's role is refused.
\set ON_ERROR_STOP on

CREATE ROLE :"name" LOGIN PASSWORD :'password' NOSUPERUSER NOCREATEDB NOCREATEROLE;

-- To make the role a database's owner the master must be able to act as it (PostgreSQL 16 and
-- later no longer give a role's creator that right implicitly).
GRANT :"name" TO CURRENT_USER;

CREATE DATABASE :"name" OWNER :"name";

-- Every new database lets PUBLIC connect: only its owner (and the master) may.
REVOKE ALL ON DATABASE :"name" FROM PUBLIC;

-- The database this runs in (the registry log and the verifiers' nonce store, both the master's):
-- no signer role connects to it either.
SELECT format('REVOKE CONNECT, TEMPORARY ON DATABASE %I FROM PUBLIC', current_database()) \gexec
