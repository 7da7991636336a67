"""The coordinator's tests reuse the store tests' PostgreSQL fixtures (real server, one schema per test)."""

from tests.stores.conftest import dynamodb_emulator, pg_schemas, postgres_server

__all__ = ["dynamodb_emulator", "pg_schemas", "postgres_server"]
