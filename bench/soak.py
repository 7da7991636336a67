"""The memory soak: each daemon's resident memory over 100,000 requests (``make soak``; kept out of
``make bench`` so that one finishes within ten minutes)."""

from __future__ import annotations

import json
from typing import Any

from bench.mesh import SERVICE_CPU, _memory, memory_report, pinned_mesh


def run(quick: bool = False) -> dict[str, Any]:
    with pinned_mesh("countersign-soak-") as mesh:
        return {"service_cpu": SERVICE_CPU, **_memory(mesh, quick)}


def report(results: dict[str, Any]) -> str:
    return memory_report(results)


def as_json(results: dict[str, Any]) -> str:
    return json.dumps(results, indent=2)
