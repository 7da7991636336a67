"""Fixtures of the foreign-client test: the runtime tests' mesh, one per pytest(-xdist) worker."""

from tests.runtime.conftest import nowhere, pytest_runtest_makereport, registry_file, runtime, runtime_mesh

__all__ = ["nowhere", "pytest_runtest_makereport", "registry_file", "runtime", "runtime_mesh"]
