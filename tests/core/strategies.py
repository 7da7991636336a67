"""Hypothesis strategies for protocol objects: valid paths built by honest issuers."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence
from typing import Any, Protocol

from hypothesis import strategies as st

from countersign.canonical import sha256_digest
from countersign.constructions import RecordFields, issue, local_parent_cosigner
from countersign.records import (
    MAX_PATH_LENGTH,
    AgentRef,
    BindingScope,
    Construction,
    Envelope,
    LifecycleEvent,
    OutputReceipt,
    Path,
    Policy,
)
from countersign.samples import SampleMesh

DEPLOYERS = ("deployer-a", "deployer-b", "deployer-c")
MESH = SampleMesh.create(DEPLOYERS, seed=b"hypothesis")
NOW_MS = 1_780_000_000_000
IDENTIFIER_ALPHABET = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in '"\\')

identifiers = st.text(alphabet=IDENTIFIER_ALPHABET, min_size=1, max_size=24)


@st.composite
def outputs(draw: st.DrawFn) -> bytes:
    return draw(st.binary(min_size=0, max_size=256))


@st.composite
def valid_paths(
    draw: st.DrawFn,
    constructions: st.SearchStrategy[Construction] = st.sampled_from(list(Construction)),
    max_length: int = 6,
) -> tuple[Path, bytes]:
    """A valid path (with its output) issued by honest deployers of ``MESH``."""
    construction = draw(constructions)
    length = draw(st.integers(1, min(max_length, MAX_PATH_LENGTH)))
    route = draw(st.lists(st.sampled_from(DEPLOYERS), min_size=length, max_size=length))
    output = draw(outputs())
    system = draw(identifiers)
    envelopes: list[Envelope] = []
    expires = NOW_MS + draw(st.integers(60_000, 10**9))
    for index, deployer in enumerate(route):
        leaf = index == length - 1
        expires -= draw(st.integers(0, 1_000))
        seq = draw(st.integers(0, 2**20))
        policy = Policy(
            allowed_children=draw(st.none() | st.just(DEPLOYERS)),
            max_depth=draw(st.none() | st.integers(length, 63)),
        )
        fields = RecordFields(
            deployer=deployer,
            agent=AgentRef(draw(identifiers), system),
            created_ms=NOW_MS - draw(st.integers(0, 10**6)),
            expires_ms=expires,
            max_children=draw(st.integers(1, 65_535)),
            event=draw(st.sampled_from(list(LifecycleEvent))),
            policy=policy,
            output=OutputReceipt(
                sha256_digest(output) if leaf else sha256_digest(draw(outputs())),
                draw(st.sampled_from(list(BindingScope))),
                draw(identifiers),
                seq,
                None if seq == 0 else sha256_digest(b"previous %d" % seq),
            )
            if leaf or draw(st.booleans())
            else None,
        )
        parent = MESH.signers[envelopes[-1].record.deployer] if envelopes else None
        envelopes.append(
            issue(
                construction,
                fields,
                MESH.signers[deployer] if construction.signed else None,
                envelopes,
                parent_key_id=None if parent is None else parent.key_id,
                parent_cosigner=None if parent is None else local_parent_cosigner(parent),
            )
        )
    return Path(tuple(envelopes)), output


# --- mutated JSON text: the corpus the compiled decoder is held equal to the reference parser on -----


class Token(str):
    """JSON text written as it is: a number spelled ``-0``, ``1.0`` or ``1e2``."""


class Members(list[tuple[str, Any]]):
    """A JSON object as its members in order; a key may repeat (what a dict cannot hold)."""


def as_tree(value: Any) -> Any:
    """``value`` with every object as :class:`Members`, so that mutations can repeat keys."""
    if isinstance(value, dict):
        return Members((key, as_tree(item)) for key, item in value.items())
    if isinstance(value, list):
        return [as_tree(item) for item in value]
    return value


# (separator between items, between key and value, before the first and after the last item)
STYLES = [(",", ":", ""), (", ", ": ", ""), (",\n  ", ": ", "\n"), (",\t", ":\r\n", " ")]


def write_json(tree: Any, style: tuple[str, str, str] = STYLES[0], escaped: frozenset[str] = frozenset()) -> bytes:
    """JSON text of ``tree``: strings as UTF-8 (escaped only where JSON must, or each character of
    ``escaped`` as ``\\uXXXX``), a lone surrogate as its raw (invalid) UTF-8."""
    between, colon, edge = style

    def text(value: str) -> str:
        body = json.dumps(value, ensure_ascii=False)[1:-1]
        for char in escaped:
            body = body.replace(char, f"\\u{ord(char):04x}")
        return f'"{body}"'

    def write(node: Any) -> str:
        if isinstance(node, Token):
            return str(node)
        if isinstance(node, Members):
            inner = between.join(f"{text(key)}{colon}{write(item)}" for key, item in node)
            return "{" + edge + inner + edge + "}" if node else "{}"
        if isinstance(node, list):
            return "[" + edge + between.join(write(item) for item in node) + edge + "]" if node else "[]"
        if isinstance(node, str):
            return text(node)
        return json.dumps(node)

    return write(tree).encode("utf-8", "surrogatepass")


# Near misses of real values: other JSON types, the bool/int confusion, the bounds of every range,
# strings that almost match a pattern, other spellings of numbers, nesting.
ODD_VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2, 63, 64, 65_535, 65_536, 2**32, 2**32 + 1, 2**53 - 1, 2**53, 10**30,
    Token("1.0"), Token("1e2"), Token("-1.5"), "", "x", "é", "\x01", "a b", "\ud800", "deployer-a", "Deployer-a",
    "ed25519:" + "0" * 32, "ed25519:" + "0" * 31, "sha256:" + "a" * 64, "SHA256:" + "a" * 64, "sha256:" + "A" * 64,
    "a" * 32, "a" * 33, "A" * 85 + "Q", "A" * 85 + "B", "A" * 86 + "Q", "per_session", "per_n_tokens", "per_turn",
    "tokens", "bytes", "parent", "child", "signed-dag", "no-chain", "naive-sig", "new", "fine_tune", [], {}, [None],
    ["deployer-a", "deployer-a"], {"count": 0, "last": None}, {"unit": "bytes", "n": 8, "units": 8},
    {"instance": "i", "system": "s"}, {"allowed_children": None, "max_depth": None}, [[[[[[[[[[[[0]]]]]]]]]]]],
]  # fmt: skip


def _places(tree: Any) -> list[tuple[Any, int]]:
    """Every value's place: (its Members or list, its position there); the root is not one."""
    found: list[tuple[Any, int]] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, Members | list) and not isinstance(node, Token):
            for position, item in enumerate(node):
                found.append((node, position))
                stack.append(item[1] if isinstance(node, Members) else item)
    return found


def _get(container: Any, position: int) -> Any:
    return container[position][1] if isinstance(container, Members) else container[position]


def _put(container: Any, position: int, value: Any) -> None:
    if isinstance(container, Members):
        container[position] = (container[position][0], value)
    else:
        container[position] = value


class Chooser(Protocol):
    """Where a mutation's choices come from: a hypothesis draw, or a seeded random for a fixed corpus."""

    def choice(self, options: Sequence[Any]) -> Any: ...

    def randint(self, low: int, high: int) -> int: ...


def mutate(value: Any, chooser: Chooser) -> tuple[bytes, bool]:
    """JSON text of ``value`` after one to three mutations, and whether any mutation only spelled a
    value otherwise (a repeated key, ``-0``, an escape): the compiled decoder leaves those to the
    reference parser, which alone knows whether they are valid."""
    tree = as_tree(copy.deepcopy(value))
    respelled = False
    escaped: set[str] = set()
    for _ in range(chooser.randint(1, 3)):
        places = _places(tree)
        if not places:  # everything deleted: nothing left to change
            break
        container, position = chooser.choice(places)
        current = _get(container, position)
        operation = chooser.choice(["replace", "replace", "swap", "delete", "add", "repeat", "respell"])
        if operation == "replace":
            _put(container, position, copy.deepcopy(chooser.choice(ODD_VALUES)))
        elif operation == "swap":  # another value of the same document: a plausible type confusion
            donor_container, donor_position = chooser.choice(places)
            _put(container, position, copy.deepcopy(_get(donor_container, donor_position)))
        elif operation == "delete":
            del container[position]
        elif operation == "add" and isinstance(container, Members):
            container.insert(position, (chooser.choice(["x", "V", "depth ", ""]), 0))
        elif operation == "repeat" and isinstance(container, Members):
            twin = copy.deepcopy(chooser.choice([current, *ODD_VALUES]))
            container.insert(position + chooser.randint(0, 1), (container[position][0], twin))
            respelled = True
        elif operation == "respell":
            if type(current) is int and current == 0:
                _put(container, position, Token("-0"))
                respelled = True
            elif isinstance(current, str) and current:
                escaped.add(chooser.choice(sorted(set(current))))
                respelled = True
    return write_json(tree, chooser.choice(STYLES), frozenset(escaped)), respelled


class _Drawn:
    def __init__(self, draw: st.DrawFn) -> None:
        self._draw = draw

    def choice(self, options: Sequence[Any]) -> Any:
        return self._draw(st.sampled_from(options))

    def randint(self, low: int, high: int) -> int:
        return self._draw(st.integers(low, high))


@st.composite
def mutated(draw: st.DrawFn, value: Any) -> tuple[bytes, bool]:
    """:func:`mutate` with hypothesis's choices."""
    return mutate(value, _Drawn(draw))


def mutation_corpus(values: Sequence[Any], count: int, seed: int) -> list[tuple[bytes, bool]]:
    """A fixed list of :func:`mutate` results (choices from a seeded random), over ``values`` in turn."""
    rng = random.Random(seed)
    return [mutate(values[index % len(values)], rng) for index in range(count)]


@st.composite
def damaged(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with one to three bytes inserted, replaced or deleted (JSON's own characters mostly)."""
    alphabet = b'"{}[],:\\ 0123456789-.eEtfnul\xff\xef\t\n'
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(out)))
        byte = draw(st.sampled_from(alphabet))
        operation = draw(st.sampled_from(["insert", "replace", "delete"]))
        if operation == "insert" or at == len(out):
            out.insert(at, byte)
        elif operation == "replace":
            out[at] = byte
        else:
            del out[at]
    return bytes(out)


def near_misses(value: Any) -> list[bytes]:
    """JSON text of ``value`` with one string changed to a near miss of itself (one character more,
    one fewer, upper case, a second copy after a newline), for every string of the document in turn:
    each pattern of spec 2.4 and every rule that compares strings meets its own kind of miss."""
    texts = []
    tree = as_tree(value)
    for container, position in _places(tree):
        current = _get(container, position)
        if not isinstance(current, str):
            continue
        for miss in (current + current[-1:], current[:-1], current.upper(), f"{current}\n{current}"):
            if miss != current:
                _put(container, position, miss)
                texts.append(write_json(tree))
        _put(container, position, current)
    return texts
