"""A three-zone test harness for the Countersign mesh: network namespaces, delay proxies, faults.

Not part of the installed wheel; run from the repository root (``python -m tools.zones …``). See
docs/zones.md.
"""
