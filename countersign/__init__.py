"""Countersign: evidence for multi-agent delegation across deployers.

The protocol core lives in this package and does no network or disk I/O: records and their canonical
bytes (:mod:`countersign.records`, :mod:`countersign.canonical`), keys and the signer seam
(:mod:`countersign.keys`), the six lineage constructions (:mod:`countersign.constructions`), path
verification (:mod:`countersign.verify`) with its typed reasons (:mod:`countersign.reasons`), the
registry view (:mod:`countersign.registry`), the verifier-state interface (:mod:`countersign.state`),
and what a consumer gets back with the offline check (:mod:`countersign.consumer`: one verdict shape).
Clients (:mod:`countersign.client`), the daemons and the command line (:mod:`countersign_cli`) are
shells on top (docs/adr/0010-one-way-layering.md).
"""

from countersign.reasons import Reason, Verdict, VerificationResult
from countersign.records import Construction, Envelope, NodeRecord, Path
from countersign.verify import Mode, VerifierPolicy, check_lineage, verify_path, verify_path_bytes

__version__ = "0.1.0"

__all__ = [
    "Construction",
    "Envelope",
    "Mode",
    "NodeRecord",
    "Path",
    "Reason",
    "Verdict",
    "VerificationResult",
    "VerifierPolicy",
    "check_lineage",
    "verify_path",
    "verify_path_bytes",
]
