"""Peers run beside Countersign in the same process and rounds (never a constant from another day).

* HDP (Human Delegation Provenance, the ``hdp-langchain`` package on PyPI; each HDP Python package
  carries the same core): a root token and four hops, five Ed25519 signatures by one key over RFC 8785
  bytes, verified from its JSON text with the package's own ``verify_chain``.
* AIP's Biscuit chain (``biscuit-python``, the Biscuit reference implementation's bindings): an
  authority block and four attenuation blocks, verified from bytes and authorized.

Both are the ``bench`` extra (``make bench`` installs it; ``make test`` does not). A peer that cannot be
imported is reported unavailable, with the import error, never replaced by a figure.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


@dataclass(frozen=True)
class Peer:
    name: str
    signatures: int
    size_bytes: int
    verify: Callable[[], object] | None
    unavailable: str = ""


def hdp_depth5() -> Peer:
    name = "HDP depth-5 chain (hdp-langchain verify_chain, from JSON)"
    try:
        hdp: Any = importlib.import_module("hdp_langchain")  # optional (the bench extra): typed as it comes
    except ImportError as exc:
        return Peer(name, 5, 0, None, f"not installed ({exc}); `make bench` installs the bench extra")
    seed = hashlib.sha256(b"bench-hdp").digest()
    public = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    middleware = hdp.HdpMiddleware(
        signing_key=seed,
        session_id="bench-session",
        principal=hdp.HdpPrincipal(id="operator@example.org", id_type="email"),
        scope=hdp.ScopePolicy(intent="benchmark delegation", authorized_tools=["search"], max_hops=8),
        key_id="bench-key",
    )
    middleware.before_kickoff()
    for hop in range(4):  # the package's own chain extension (what its callback handler calls)
        middleware._extend_chain(f"agent-{hop + 1}", f"delegated step {hop + 1}")
    text = middleware.export_token_json(indent=0)
    assert text is not None
    text = text.replace("\n", "")
    result = hdp.verify_chain(text, public)
    if not result.valid or result.hop_count != 4:
        return Peer(name, 5, len(text), None, f"the package's own chain does not verify: {result.violations}")

    def verify() -> object:
        outcome = hdp.verify_chain(text, public)
        assert outcome.valid
        return outcome

    return Peer(name, 5, len(text.encode()), verify)


def biscuit_depth5() -> Peer:
    name = "Biscuit chain, 5 blocks (biscuit-python, from bytes, authorized)"
    try:
        biscuit: Any = importlib.import_module("biscuit_auth")  # its shipped stubs lag its API
    except ImportError as exc:
        return Peer(name, 5, 0, None, f"not installed ({exc}); `make bench` installs the bench extra")
    keys = biscuit.KeyPair.from_private_key(
        biscuit.PrivateKey.from_bytes(hashlib.sha256(b"bench-biscuit").digest(), biscuit.Algorithm.Ed25519)
    )
    token = biscuit.BiscuitBuilder('user("operator"); right("output-1", "emit");').build(keys.private_key)
    for hop in range(4):  # each delegate attenuates: an agent may only emit this output
        token = token.append(biscuit.BlockBuilder(f'check if resource("output-1"), operation("emit"); agent({hop});'))
    data = token.to_bytes()
    root = keys.public_key

    def verify() -> object:
        parsed = biscuit.Biscuit.from_bytes(data, root)
        builder = biscuit.AuthorizerBuilder(
            'resource("output-1"); operation("emit"); allow if user($u), right("output-1", "emit");'
        )
        limits = builder.limits()
        limits.max_time = datetime.timedelta(seconds=1)  # the default 1 ms trips on a busy shared host
        builder.set_limits(limits)
        return builder.build(parsed).authorize()

    try:
        verify()
    except Exception as exc:
        return Peer(name, 5, len(data), None, f"its own token does not verify: {exc}")
    return Peer(name, 5, len(data), verify)
