"""LangGraph: sign every node's output as a receipt, and co-sign each hand-off between deployers.

Wrap each node with :func:`signed_node`, naming the deployer that hosts it::

    signing = MeshSigning({"deployer-a": planner_runtime, "deployer-b": researcher_runtime}, system="research")
    builder = StateGraph(State)                  # State extends EvidenceState
    builder.add_node("planner", signed_node(planner, "deployer-a", signing))
    builder.add_node("researcher", signed_node(researcher, "deployer-b", signing))

Each wrapped node, before its function runs, obtains its agent record: a root for the first node, a
same-deployer child when the previous node ran on the same deployer, and otherwise a co-signed
delegation (the previous deployer's signer opens a grant, this deployer's signer obtains the parent's
co-signature). A refusal fails closed: the node does not run and the error (a
:class:`countersign.client.ServiceError` with its ``code``) leaves ``invoke``/``ainvoke``. After the
function returns, its output (the state keys it wrote, encoded by :func:`state_output_bytes`) is signed as a
receipt under that record. The graph's state carries the evidence under ``"countersign"``
(:class:`Evidence`: the latest agent's path, every receipt in order, and a delegation waiting to be
accepted when the graph was started by another deployer's handoff). A consumer checks the final state
with :func:`verify_state` and its :class:`countersign.client.Consumer`.

Sync nodes take a :class:`MeshSigning` over :class:`countersign.client.Runtime` objects (and run under
``invoke`` or ``ainvoke``); ``async def`` nodes take an :class:`AsyncMeshSigning` over
:class:`countersign.client.AsyncRuntime` objects (``ainvoke``). Anything that implements
:class:`Signing` or :class:`AsyncSigning` can stand in for the mesh (the workflow benchmark signs in
process with the core's constructions).

Needs the ``langgraph`` extra (``pip install 'countersign-mesh[langgraph]'``); this module imports
``langgraph`` only when a node is wrapped.
"""

import dataclasses
import functools
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

from countersign.client.consumer import Consumer
from countersign.consumer import EvidenceVerdict
from countersign.handoff import Delegation
from countersign.integrations import kit
from countersign.integrations.kit import AsyncMeshSigning, AsyncSigning, MeshSigning, Signing
from countersign.records import Path

__all__ = [
    "CHECKPOINT_TYPES",
    "EVIDENCE_KEY",
    "AsyncMeshSigning",
    "AsyncSigning",
    "Evidence",
    "EvidenceState",
    "MeshSigning",
    "SignedOutput",
    "Signing",
    "StateVerdict",
    "averify_state",
    "merge_evidence",
    "require_langgraph",
    "signed_node",
    "state_output_bytes",
    "verify_state",
]  # fmt: skip

EVIDENCE_KEY = "countersign"
EXTRA = "langgraph"


def require_langgraph() -> Any:
    """The ``langgraph.types`` module; ImportError naming the extra when LangGraph is not installed."""
    return kit.require("langgraph", EXTRA, lambda: importlib.import_module("langgraph.types"))


# --- evidence in the graph's state --------------------------------------------------------------


@dataclass(frozen=True)
class SignedOutput:
    """One node run's output receipt: which agent emitted it, which state keys its bytes come from,
    and the receipt path as canonical path JSON (``receipt_json``; :attr:`receipt` parses it, strictly,
    once). Plain fields, so that a checkpointer stores it and a state read back from one is re-parsed
    as evidence, not trusted as objects."""

    node: str  # the agent instance (the node's name unless given)
    keys: tuple[str, ...]  # the state keys of the node's output, in the order it wrote them
    receipt_json: bytes

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.keys))  # a checkpoint gives lists back

    @classmethod
    def of(cls, node: str, keys: Sequence[str], receipt: Path) -> "SignedOutput":
        signed = cls(node, tuple(keys), receipt.to_bytes())
        signed.__dict__["receipt"] = receipt
        return signed

    @functools.cached_property
    def receipt(self) -> Path:
        """The receipt path. Raises MalformedError when the stored bytes are not one."""
        return Path.from_bytes(self.receipt_json)


@dataclass(frozen=True)
class Evidence:
    """What the graph's state carries under ``"countersign"``.

    :attr:`path`: the record of the agent that ran last (the parent of the next node's record);
    ``receipts``: every node run's :class:`SignedOutput`, in order; :attr:`handoff`: another
    deployer's delegation for the graph's first node to accept (:meth:`from_handoff`), spent once it
    is. Stored as path JSON and the handoff string (``path_json``, ``handoff_text``), parsed strictly on
    first use, so the state survives a checkpointer (``CHECKPOINT_TYPES``)."""

    path_json: bytes | None = None
    receipts: tuple[SignedOutput, ...] = ()
    handoff_text: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "receipts", tuple(self.receipts))

    @classmethod
    def of(
        cls, path: Path | None, receipts: Sequence[SignedOutput] = (), handoff: Delegation | None = None
    ) -> "Evidence":
        evidence = cls(
            None if path is None else path.to_bytes(), tuple(receipts), None if handoff is None else str(handoff)
        )
        evidence.__dict__.update(path=path, handoff=handoff)
        return evidence

    @classmethod
    def from_handoff(cls, handoff: Delegation | str) -> "Evidence":
        """Start a graph under another deployer's delegation (parsed strictly if a string; raises
        :class:`countersign.client.HandoffError`)."""
        return cls.of(None, (), Delegation.from_string(handoff) if isinstance(handoff, str) else handoff)

    @functools.cached_property
    def path(self) -> Path | None:
        return None if self.path_json is None else Path.from_bytes(self.path_json)

    @functools.cached_property
    def handoff(self) -> Delegation | None:
        return None if self.handoff_text is None else Delegation.from_string(self.handoff_text)

    def receipt_of(self, node: str) -> Path:
        """The latest receipt of ``node``. Raises KeyError if it signed none."""
        for signed in reversed(self.receipts):
            if signed.node == node:
                return signed.receipt
        raise KeyError(node)


# The types a checkpointer's serializer must be allowed to rebuild when it is strict, for example
# ``JsonPlusSerializer(allowed_msgpack_modules=CHECKPOINT_TYPES)``: fields of plain bytes, str, tuples.
CHECKPOINT_TYPES = ((__name__, "Evidence"), (__name__, "SignedOutput"))


def merge_evidence(left: Evidence | None, right: Evidence | None) -> Evidence:
    """The reducer of the evidence key: receipts accumulate in order, the newest agent path wins, and a
    pending handoff is spent by the first update that brings an agent path. (Parallel branches each
    add their receipts; ``path`` is then the last branch merged.)"""
    if left is None or right is None:
        return right or left or Evidence()
    if right.path_json is not None:
        merged = Evidence(right.path_json, left.receipts + right.receipts, None)
        if "path" in right.__dict__:
            merged.__dict__["path"] = right.path
        return merged
    pending = right if right.handoff_text is not None else left
    merged = Evidence(left.path_json, left.receipts + right.receipts, pending.handoff_text)
    for name, source in (("path", left), ("handoff", pending)):
        if name in source.__dict__:
            merged.__dict__[name] = source.__dict__[name]
    return merged


class EvidenceState(TypedDict, total=False):
    """Extend this with the graph's own keys: ``class State(EvidenceState): topic: str``."""

    countersign: Annotated[Evidence, merge_evidence]


def state_output_bytes(output: Mapping[str, Any]) -> bytes:
    """The exact bytes a node's output is signed as: a single ``str`` value as UTF-8, a single
    ``bytes`` value as it is, anything else as RFC 8785 canonical JSON of the keys and values
    (:func:`countersign.integrations.kit.output_bytes`). Raises TypeError for values JSON cannot hold."""
    if len(output) == 1:
        (value,) = output.values()
        if isinstance(value, str | bytes):
            return kit.output_bytes(value)
    try:
        return kit.output_bytes(dict(output))
    except TypeError as exc:
        raise TypeError(f"a node's output: {exc}; name its keys with output_keys=") from None


# The mesh (MeshSigning, AsyncMeshSigning) and the Signing protocols are the kit's (ADR 0037); the
# roots a graph starts name the system "agents" unless MeshSigning(..., system=...) says otherwise.


# --- the node wrapper ---------------------------------------------------------------------------


def _evidence(state: object) -> Evidence:
    found = state.get(EVIDENCE_KEY) if isinstance(state, Mapping) else getattr(state, EVIDENCE_KEY, None)
    if found is None:
        return Evidence()
    if not isinstance(found, Evidence):
        raise TypeError(f"state[{EVIDENCE_KEY!r}] must be an Evidence, not {type(found).__name__}")
    return found


def _split(result: object, node: str, output_keys: Sequence[str] | None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The node's state update (a dict, or a Command's update) and the keys its signed output is read from."""
    update = result.update if isinstance(result, require_langgraph().Command) else result
    if update is None:
        update = {}
    if not isinstance(update, Mapping):
        raise TypeError(f"node {node} must return a dict (or a Command with a dict update) to be signed")
    if EVIDENCE_KEY in update:
        raise ValueError(f"node {node} wrote {EVIDENCE_KEY!r}: that key is the evidence, written by the wrapper")
    keys = tuple(update) if output_keys is None else tuple(output_keys)
    missing = [key for key in keys if key not in update]
    if missing:
        raise KeyError(f"node {node} did not write its output keys {missing}")
    return dict(update), keys


def _with_evidence(result: object, update: dict[str, Any], evidence: Evidence) -> object:
    new_update = {**update, EVIDENCE_KEY: evidence}
    if isinstance(result, require_langgraph().Command):
        return dataclasses.replace(result, update=new_update)
    return new_update


def signed_node(
    fn: Callable[..., Any],
    deployer: str,
    signing: Signing | AsyncSigning,
    *,
    instance: str | None = None,
    output_keys: Sequence[str] | None = None,
) -> Callable[..., Any]:
    """``fn`` as a node hosted by ``deployer``: its agent record is issued before it runs, and its
    output (the keys ``output_keys`` of its update, by default every key it wrote) is signed as a
    receipt after. ``instance`` names the agent (default: the function's name).

    The wrapper keeps ``fn``'s name and signature, so LangGraph passes it the same arguments (config,
    runtime, ...). ``async def`` nodes need an :class:`AsyncSigning`, sync nodes a :class:`Signing`."""
    require_langgraph()
    name = instance or fn.__name__
    async_node = inspect.iscoroutinefunction(fn)
    if async_node != inspect.iscoroutinefunction(signing.agent):
        wanted = "an AsyncMeshSigning (AsyncSigning)" if async_node else "a MeshSigning (Signing)"
        raise TypeError(f"node {name} is {'async' if async_node else 'sync'}: sign it with {wanted}")

    if async_node:
        asigning: AsyncSigning = signing  # type: ignore[assignment]  # checked just above

        @functools.wraps(fn)
        async def async_signed(state: Any, **kwargs: Any) -> Any:
            evidence = _evidence(state)
            agent = await asigning.agent(deployer, name, evidence.path, evidence.handoff)
            result = await fn(state, **kwargs)
            update, keys = _split(result, name, output_keys)
            receipt = await asigning.receipt(deployer, agent, state_output_bytes({k: update[k] for k in keys}))
            return _with_evidence(result, update, Evidence.of(agent, (SignedOutput.of(name, keys, receipt),)))

        return async_signed

    ssigning: Signing = signing  # type: ignore[assignment]  # checked just above

    @functools.wraps(fn)
    def sync_signed(state: Any, **kwargs: Any) -> Any:
        evidence = _evidence(state)
        agent = ssigning.agent(deployer, name, evidence.path, evidence.handoff)
        result = fn(state, **kwargs)
        update, keys = _split(result, name, output_keys)
        receipt = ssigning.receipt(deployer, agent, state_output_bytes({k: update[k] for k in keys}))
        return _with_evidence(result, update, Evidence.of(agent, (SignedOutput.of(name, keys, receipt),)))

    return sync_signed


# --- the consumer's check of a final state ------------------------------------------------------


@dataclass(frozen=True)
class StateVerdict(kit.OutputVerdicts[SignedOutput]):
    """The verdicts on every signed output of a graph's final state, each the one verdict shape
    (:class:`countersign.consumer.EvidenceVerdict`) beside the output it is for. Truthy only when
    there is at least one and every one was accepted."""

    outputs: tuple[tuple[SignedOutput, EvidenceVerdict], ...]


def _outputs(state: object) -> list[tuple[SignedOutput, bytes, bytes]]:
    """Each receipt with the bytes the consumer actually holds: the final state's values of its keys."""
    evidence = _evidence(state)
    values: Mapping[str, Any] = state if isinstance(state, Mapping) else vars(state)
    checks = []
    for signed in evidence.receipts:
        missing = [key for key in signed.keys if key not in values]
        if missing:
            raise KeyError(f"the state lacks {missing}, the output of {signed.node}")
        checks.append((signed, signed.receipt_json, state_output_bytes({key: values[key] for key in signed.keys})))
    return checks


def verify_state(state: object, consumer: Consumer, *, audit: bool = False) -> StateVerdict:
    """Check every receipt of a graph's final ``state`` with ``consumer`` (online or offline, its
    policy applied as there) against the bytes the state holds now, so an output changed after it
    was signed is ``OUTPUT_MISMATCH``. Accept mode consumes each receipt; ``audit`` consumes nothing.
    Raises KeyError when the state lacks an output's keys, ServiceError when a verifier refuses."""
    return StateVerdict(tuple(kit.verify_outputs(_outputs(state), consumer, audit=audit)))


async def averify_state(state: object, consumer: Consumer, *, audit: bool = False) -> StateVerdict:
    """:func:`verify_state` for an event loop."""
    return StateVerdict(tuple(await kit.averify_outputs(_outputs(state), consumer, audit=audit)))
