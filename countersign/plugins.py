"""One registry per kind of plug-in (ADR 0038).

Each kind (a verifier store, a signer's state store, the coordinator's log store, a signer key backend,
an export format) is one dict from a name (a URL scheme, a format's name) to a :class:`Plugin`, kept
with the code that uses it: a daemon's stores with the daemon, the export formats with the exports.
Several names may share one plug-in (``postgres`` beside ``postgresql``). The command line reads the
dicts for its choices and help; a missing optional package becomes one hint naming the extra that
brings it (:func:`countersign.extras.needs_extra`). A new plug-in is its own module, one line in its
kind's dict, its tests and its docs (docs/extending.md).

Pure: the core imports no plug-in. A plug-in's ``make`` imports its module when it is called, so a
registry imports without the extras its plug-ins need.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from countersign.extras import EXTRAS, extra_bringing, needs_extra

F_co = TypeVar("F_co", bound=Callable[..., Any], covariant=True)  # a Plugin of a narrower maker is one of a wider
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Plugin(Generic[F_co]):
    """One plug-in: ``make`` builds it (and imports its module, only then); ``usage`` is how a user
    names it (``postgresql://user@host/db?schema=NAME``); ``summary`` says what it is in a few words;
    ``extra`` is the extra that brings the packages it needs (None: the core's own suffice)."""

    make: F_co
    usage: str
    summary: str
    extra: str | None = None

    def __post_init__(self) -> None:
        if self.extra is not None and self.extra not in EXTRAS:
            raise ValueError(f"plug-in {self.usage!r} names {self.extra!r}, which is no extra of the distribution")

    def described(self) -> str:
        """``usage (summary; the 'x' extra)``, as help lists it."""
        needs = "" if self.extra is None else f"; the '{self.extra}' extra"
        return f"{self.usage} ({self.summary}{needs})"


def described(table: Mapping[str, Plugin[Any]]) -> str:
    """Every plug-in of ``table`` once (names that share one are one entry), in the table's order."""
    seen: list[Plugin[Any]] = []
    for plugin in table.values():
        if not any(plugin is other for other in seen):
            seen.append(plugin)
    return ", ".join(plugin.described() for plugin in seen)


def unknown(kind: str, name: str, table: Mapping[str, Plugin[Any]]) -> str:
    """The message for a name ``table`` lacks, listing the names it has."""
    return f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}"


def open_plugin(
    table: Mapping[str, Plugin[Callable[[str], T]]],
    name: str,
    argument: str,
    *,
    kind: str,
    error: Callable[[str], Exception],
) -> T:
    """``table[name].make(argument)``. Raises ``error(message)`` for a name the table lacks (the
    message lists those it has) and for a missing package that an extra brings (the message names the
    extra); a missing module that no extra brings is a bug of the house and propagates as it is."""
    plugin = table.get(name)
    if plugin is None:
        raise error(unknown(kind, name, table))
    try:
        return plugin.make(argument)
    except ModuleNotFoundError as exc:
        extra = extra_bringing(exc.name)
        if extra is None:
            raise
        raise error(f"{kind} {name!r} needs {needs_extra(extra, exc.name)}") from None
