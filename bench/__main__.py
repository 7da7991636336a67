"""``python -m bench [--quick] [--only SECTION ...] [--json FILE]``: print the benchmark tables."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

SECTIONS = ("core", "issuance", "signing", "capacity", "mesh", "stores", "idle", "sessions")
# Run only when named: the 100,000-request memory soak (``make soak``) and the verdict log's size on
# every backend take longer than ``make bench`` should.
ON_REQUEST = ("soak", "verdict_log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run, not for figures)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS + ON_REQUEST, default=list(SECTIONS))
    parser.add_argument("--json", type=Path, help="also write the raw figures as JSON")
    args = parser.parse_args(argv)
    raw: dict[str, object] = {}
    for name in args.only:
        section = importlib.import_module(f"bench.{name}")
        results = section.run(quick=args.quick)
        print(section.report(results), flush=True)
        print(flush=True)
        raw[name] = json.loads(section.as_json(results))
    if args.json:
        args.json.write_text(json.dumps(raw, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
