"""Plumbing shared by the three daemons: configuration, mTLS, gRPC servers, errors, metrics, logs,
and the registry follower. The daemons themselves live in ``signer/``, ``coordinator/``, ``verifier/``."""
