"""The guard that keeps the offline tier offline: while an offline test is set up and runs, opening a
socket (connect, bind, sendto, name look-ups; AF_UNIX included), creating a gRPC channel or server, or
starting a process (subprocess, os.fork/exec/spawn/posix_spawn, os.system, multiprocessing) is refused.

Sockets and processes are watched through Python's audit hooks (PEP 578): they fire inside the C
functions themselves, however the caller imported them. gRPC's C core opens its sockets without them,
so its channel and server factories are wrapped instead. A refused call raises :class:`OfflineViolation`
and is also recorded, so that code which catches the error (``except Exception``) cannot hide it: the
conftest fails the test on any record. Threads that were running before the test started (left by
earlier tests of other tiers on the same worker) are not watched; threads the test starts are.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# Audit events (https://docs.python.org/3/library/audit_events.html) that reach outside the process.
SOCKET_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
    }
)
PROCESS_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system"}
)
GRPC_FACTORIES = (
    ("grpc", ("insecure_channel", "secure_channel", "server")),
    ("grpc.aio", ("insecure_channel", "secure_channel", "server")),
)


class OfflineViolation(RuntimeError):
    """An offline-tier test tried to open a socket or start a process."""


class OfflineGuard:
    def __init__(self) -> None:
        self._active = False
        self._foreign_threads: frozenset[int] = frozenset()
        self._violations: list[str] = []
        self._hook_installed = False
        self._restore: list[Callable[[], None]] = []

    # --- the window -------------------------------------------------------------------------------

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Refuse sockets and processes inside the block (on this thread and the threads it starts)."""
        if not self._hook_installed:
            sys.addaudithook(self._audit)  # hooks cannot be removed: it stays, idle outside the window
            self._hook_installed = True
        self._foreign_threads = frozenset(t.ident for t in threading.enumerate() if t.ident is not None) - {
            threading.get_ident()
        }
        self._wrap_factories()
        self._active = True
        try:
            yield
        finally:
            self._active = False
            for restore in reversed(self._restore):
                restore()
            self._restore.clear()

    def take(self) -> list[str]:
        """The refusals recorded so far, and forget them."""
        taken, self._violations = self._violations, []
        return taken

    # --- the checks -------------------------------------------------------------------------------

    def refuse(self, what: str) -> None:
        if not self._active or threading.get_ident() in self._foreign_threads:
            return
        self._violations.append(what)
        raise OfflineViolation(f"offline test {what}: mark the test daemons (or another tier) instead")

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self._active:  # the common case, on every audited event of the session: keep it cheap
            return
        if event in SOCKET_EVENTS:
            self.refuse(f"opened a socket: {event}{_shown(args[1:])}")
        elif event in PROCESS_EVENTS:
            self.refuse(f"started a process: {event}{_shown(args[:2])}")

    def _wrap_factories(self) -> None:
        import multiprocessing.process

        self._wrap(multiprocessing.process.BaseProcess, "start", "started a process: multiprocessing")
        for module_name, names in GRPC_FACTORIES:
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # a run without the grpc extra has no channels to refuse
                continue
            for name in names:
                self._wrap(module, name, f"opened a socket: {module_name}.{name}")

    def _wrap(self, owner: Any, name: str, what: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def refusing(*args: Any, **kwargs: Any) -> Any:
            self.refuse(what)
            return original(*args, **kwargs)

        setattr(owner, name, refusing)
        self._restore.append(lambda: setattr(owner, name, original))


def _shown(args: tuple[Any, ...]) -> str:
    text = repr(args)
    return text if len(text) <= 120 else text[:117] + "..."


GUARD = OfflineGuard()
