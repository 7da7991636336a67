"""Idle benchmark: how much slower the same code runs on a CPU that has just been idle.

Every daemon idles while its call crosses the network, so its part of the next call starts on a CPU
back from idle. On this project's VMs that costs more than the wake-up itself: the code that runs
next runs slower for a while (docs/zones.md). This section measures it, in one run, interleaved:

* an Ed25519 verify (PyNaCl) back to back, after sleeping 0.5, 2 and 20 ms, and after busy-waiting
  2 ms (a CPU kept busy for as long: if that one is as fast as back to back, it is the idle that
  costs, not the time passing or caches the sleep gave away);
* both signers' issuance handlers in one process (``bench.issuance.in_process_issuance``) back to back
  and with each signer's part after 0.5 and 2 ms of idle, as ``zones measure`` times its design floor.

Each figure is a median of many calls, with its ratio to the back-to-back figure of the same run.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import nacl.signing

from bench.issuance import in_process_issuance
from bench.mesh import samples_us

GAPS_MS = (0.5, 2.0, 20.0)  # sleeps before a verify
HANDLER_GAPS_MS = (0.5, 2.0)  # idle before each signer's part of an issuance
BUSY_MS = 2.0
ROUNDS = 10  # the variants take turns, so a slow minute of the host spoils every variant alike


def _sleep(ms: float) -> Callable[[], None]:
    return lambda: time.sleep(ms / 1000)


def _busy(ms: float) -> Callable[[], None]:
    def wait() -> None:
        end = time.perf_counter() + ms / 1000
        while time.perf_counter() < end:
            pass

    return wait


def run(quick: bool = False) -> dict[str, Any]:
    verifies, issuances = (60, 60) if quick else (400, 300)
    key = nacl.signing.SigningKey.generate()
    signed = key.sign(os.urandom(650))  # about one record's canonical bytes
    verify = key.verify_key

    def check() -> None:
        verify.verify(signed)

    waits: dict[str, Callable[[], None] | None] = {"back to back": None}
    waits.update({f"after {ms:g} ms idle": _sleep(ms) for ms in GAPS_MS})
    waits[f"after {BUSY_MS:g} ms busy-waiting"] = _busy(BUSY_MS)
    verify_us: dict[str, list[float]] = {label: [] for label in waits}
    handlers_us: dict[str, list[float]] = {"back to back": []}
    handlers_us.update({f"each part after {ms:g} ms idle": [] for ms in HANDLER_GAPS_MS})
    samples_us(check, 0, warmup=50)
    for _ in range(ROUNDS):
        for label, before in waits.items():
            verify_us[label].extend(samples_us(check, verifies // ROUNDS, warmup=0, before=before))
        for label, idle_ms in zip(handlers_us, (0.0, *HANDLER_GAPS_MS), strict=True):
            handlers_us[label].append(in_process_issuance(issuances // ROUNDS, idle_s=idle_ms / 1000)["p50"])
    return {
        "verify_p50_us": {label: statistics.median(samples) for label, samples in verify_us.items()},
        "issuance_handlers_p50_us": {label: statistics.median(p50s) for label, p50s in handlers_us.items()},
    }


def report(results: dict[str, Any]) -> str:
    lines = ["## The same code on a CPU just back from idle", ""]
    for title, key in (
        ("an Ed25519 verify (PyNaCl)", "verify_p50_us"),
        ("both signers' issuance handlers, one process", "issuance_handlers_p50_us"),
    ):
        figures = results[key]
        base = figures["back to back"]
        lines += [f"| {title} | p50 µs | × back to back |", "|---|---:|---:|"]
        lines += [f"| {label} | {value:,.0f} | {value / base:.2f} |" for label, value in figures.items()]
        lines.append("")
    return "\n".join(lines).rstrip()


def as_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2)
