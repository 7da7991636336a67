"""What ``countersign <daemon> serve --help`` lists: every setting of the daemon's configuration, its
environment variable, default and meaning (docs/operations.md says more about each)."""

from __future__ import annotations

import dataclasses
from typing import Any

from countersign.plugins import described

# One line per setting; a key of a table is "table.key". Kept beside the configuration dataclasses by
# tests/core/test_cli_help.py, which fails on a setting without a meaning here or in plugin_meanings.
MEANINGS = {
    "operator_public_key": "the pinned operator key (base64url); nothing else can admit a deployer",
    "listen": "gRPC address host:port (port 0 picks a free port)",
    "metrics_listen": "Prometheus endpoint host:port; empty disables it",
    "ready_file": "written atomically once serving: {grpc_port, metrics_port, pid}",
    "lifeline_fd": "a pipe's read end inherited from the process that started the daemon: when that process is "
    "gone (end of file) the daemon stops as on SIGTERM; -1: none (the local mesh sets it)",
    "log_level": "debug, info, warning or error; JSON lines on stderr",
    "max_workers": "handler threads for calls (0: two per usable CPU where that applies)",
    "heartbeat_ms": "heartbeat interval of the registry watch stream",
    "coordinator": "host:port of the coordinator (the registry stream), or its replicas' separated by commas",
    "refresh_ms": "how often a coordinator reads what its replicas appended to the shared log_store",
    "commit_batch": "writes of concurrent calls that share one durable commit, at most (1: one commit per call)",
    "decide_attempts": "how often a call overtaken by another replica's write is decided again before STATE_CONFLICT",
    "registry_cache": "file keeping the verified copy of the registry log across restarts",
    "staleness_ms": "past this long without a trusted registry update, refuse (signer) or REGISTRY_STALE (verifier)",
    "clock_skew_ms": "milliseconds other clocks may be off when checking records' times",
    "deployer": "this signer's deployer id",
    "allowed_children": "deployers this one may delegate to (empty: none across deployers)",
    "max_depth": "deepest path this signer extends",
    "max_ttl_ms": "longest lifetime of a record it issues",
    "max_grant_ttl_ms": "longest lifetime of a delegation grant it opens",
    "max_session_outputs": "receipts per session (ADR 0018)",
    "cosign_timeout_ms": "how long a delegation waits on the parent's signer to co-sign",
    "lanes_per_peer": "lanes accepted from each peer signer and runtime connection, and opened to each parent",
    "lane_idle_ms": "a co-signing lane idle this long is closed",
    "allow_baselines": "also accept NO-CHAIN, HASH-ONLY and NAIVE-SIG paths (comparison only; unsafe)",
    "collect_batch": "at most this many expired rows per table per collection transaction",
    "max_stream_chunks": "most output chunks one StreamReceipts call may send (more: RESOURCE_EXHAUSTED)",
    "max_stream_messages": "most messages one RuntimeCalls or StreamReceipts stream may send (more: refused)",
    "max_session_receipts": "most receipts one VerifySession request may carry (DynamoDB: at most 100 in accept mode)",
    "prefix_cache_entries": "verified path prefixes kept in memory (0: no cache); any registry change empties it",
    "collect_interval_ms": "how often expired nonces, child sets and old verdicts are collected",
    "lanes_per_client": "verification lanes per client connection",
    "max_lanes": "verification lanes in all (each holds a handler thread)",
    "signature_threads": "threads that may check one path's signatures side by side (ADR 0009)",
    "policies": "named consumer policies: name -> policy file or inline JSON (spec section 16)",
    "verdict_log": "log every verdict answered (ADR 0015); false also turns Impact off",
    "verdict_retention_ms": "how long logged verdicts are kept",
    "verdict_log_max_rows": "logged verdicts kept at most (over it, the client holding most loses its oldest)",
    "verdict_log_max_bytes": "bytes the verdict log may count at most (trimmed as verdict_log_max_rows)",
    "limits.streams_per_peer": "streaming calls one client identity may hold open",
    "limits.streams_total": "streaming calls open in all",
    "limits.requests_per_second_per_peer": "calls (and stream messages) per second one identity may make",
    "limits.burst_per_peer": "how far above that rate a burst may go",
    "limits.max_message_bytes": "largest request message (0: the daemon's own per-method limits)",
    "limits.receive_budget_bytes": "large request bytes parsed at once (0: four of the largest messages)",
    "tls.ca": "CA certificate file (PEM) that every peer's certificate must chain to",
    "tls.cert": "this daemon's certificate file (PEM)",
    "tls.key": "this daemon's private key file (PEM, unencrypted)",
    "tls.ca_pem": "the CA certificate inline, instead of tls.ca",
    "tls.cert_pem": "the certificate inline, instead of tls.cert",
    "tls.key_pem": "the private key inline, instead of tls.key",
    "tls.insecure_loopback": "plaintext; refused unless every address is loopback",
}


def plugin_meanings() -> dict[str, str]:
    """The settings that name a plug-in, each meaning read from its registry (countersign.plugins), so
    that the help lists every scheme there is and the extra each needs. Imports the registries (light:
    no plug-in is imported), so only when the help is shown."""
    from coordinator.log_stores import LOG_STORE_FOR_SCHEME
    from signer.backends import SIGNER_FOR_URI_SCHEME
    from signer.stores import STATE_FOR_SCHEME
    from verifier.stores import STORE_FOR_SCHEME

    return {
        "log_store": "where the registry log lives, the same for every coordinator replica: "
        + described(LOG_STORE_FOR_SCHEME),
        "signer_key": f"the signing key: {described(SIGNER_FOR_URI_SCHEME)}",
        "state_url": "the signer's durable state, the same for every replica of the deployer's signer: "
        + described(STATE_FOR_SCHEME),
        "store_url": f"the verifier's durable state: {described(STORE_FOR_SCHEME)}",
        "verdict_log_url": "where the verdict log lives when not in store_url's store (empty: there), in the"
        " same forms",
    }


def meanings() -> dict[str, str]:
    """What each setting means: :data:`MEANINGS` and :func:`plugin_meanings`."""
    return {**MEANINGS, **plugin_meanings()}


def settings(config_class: type[Any]) -> list[tuple[str, str, str]]:
    """Every setting of ``config_class`` (tables flattened to ``table.key``): name, environment
    variable and default."""
    rows: list[tuple[str, str, str]] = []
    for field in dataclasses.fields(config_class):
        default = _default(field)
        if isinstance(default, type) and dataclasses.is_dataclass(default):
            rows += [(f"{field.name}.{name}", env, value) for name, env, value in _table(field.name, default)]
            continue
        rows.append((field.name, "COUNTERSIGN_" + field.name.upper(), _shown(default)))
    return rows


def _table(table: str, cls: type[Any]) -> list[tuple[str, str, str]]:
    return [
        (f.name, f"COUNTERSIGN_{table.upper()}_{f.name.upper()}", _shown(_default(f))) for f in dataclasses.fields(cls)
    ]


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        made = field.default_factory()
        return type(made) if dataclasses.is_dataclass(made) else made
    return dataclasses.MISSING


def _shown(value: Any) -> str:
    if value is dataclasses.MISSING:
        return "required"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value in ("", {}, []):
        return "empty"
    return str(value)


def epilog(config_class: type[Any]) -> str:
    rows = settings(config_class)
    meaning = meanings()
    width = max(len(name) for name, _, _ in rows)
    lines = ["settings (TOML keys; [table] keys as table.key; each also COUNTERSIGN_<KEY> in the environment):"]
    for name, _env, default in rows:
        lines.append(f"  {name:<{width}}  {meaning.get(name, '')} (default: {default})")
    lines.append("More in docs/operations.md.")
    return "\n".join(lines)
