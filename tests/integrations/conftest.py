"""Fixtures of the integration tests: the runtime tests' mesh (deployer-a may delegate to deployer-b
only), one per pytest(-xdist) worker."""

from tests.runtime.conftest import nowhere, pytest_runtest_makereport, registry_file, runtime, runtime_mesh

__all__ = ["nowhere", "pytest_runtest_makereport", "registry_file", "runtime", "runtime_mesh"]
