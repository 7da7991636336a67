"""Worker process of the store concurrency tests (run as a script, not collected by pytest).

Reads one JSON job line on stdin: ``{"url": STORE_URL, "share_handle": bool, "paths": [PATH, ...]}``
with ``PATH = {"edges": [[parent, child, max_children, retain_until_ms, index], ...],
"leaf": [nonce, retain_until_ms, index(, request_id)], "consume": bool, "now_ms": int}``; opens the
store (one handle per thread, or one shared), prints ``ready``, waits for a ``go`` line, then admits
every path in its own thread, all released together by a barrier, and prints one JSON line with the
outcome of each path in order: ``"accept"``, ``"retry@accepted_ms"``, ``"REASON@index"``,
``"unavailable: ..."`` or ``"error: ..."``.
"""

from __future__ import annotations

import json
import sys
import threading
from typing import Any


def outcome_of(store: Any, path: dict[str, Any]) -> str:
    from countersign.errors import StateUnavailable
    from countersign.state import ChildEdge, EarlierAcceptance, LeafNonce

    edges = [ChildEdge(p, c, m, r, i) for p, c, m, r, i in path["edges"]]
    leaf = LeafNonce(*path["leaf"])
    try:
        result = store.admit(edges, leaf, consume=path.get("consume", True), now_ms=path.get("now_ms", 0))
    except StateUnavailable as exc:
        return f"unavailable: {exc}"
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    if isinstance(result, EarlierAcceptance):
        return f"retry@{result.accepted_ms}"
    return "accept" if result is None else f"{result.reason.value}@{result.index}"


def main() -> None:
    from verifier.stores import open_store

    job = json.loads(sys.stdin.readline())
    paths = job["paths"]
    shared = open_store(job["url"]) if job.get("share_handle") else None
    stores = [shared or open_store(job["url"]) for _ in paths]
    outcomes: list[str] = [""] * len(paths)
    barrier = threading.Barrier(len(paths))

    def run(i: int) -> None:
        barrier.wait()
        outcomes[i] = outcome_of(stores[i], paths[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(paths))]
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(2)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(outcomes), flush=True)
    for store in {id(s): s for s in stores}.values():
        store.close()


if __name__ == "__main__":
    main()
