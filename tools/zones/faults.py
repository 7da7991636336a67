"""``python -m tools.zones faults``: what four faults cost the runtimes of signer replicas in three zones.

The mesh (``ZoneMesh(signer_replicas=3, coordinators=2)``): a signer replica of every deployer in every
zone, each deployer's three on one PostgreSQL schema, two coordinators (zone-a, zone-b) on one PostgreSQL
log store. The load (:class:`Load`): in every zone two runtimes' worth of agents, each a parent deployer
and a child deployer whose runtimes live in that zone and use the SDK (``SignerClient``, its own zone's
replica first, failover under its default ``RetryPolicy``). Each agent, every ``period_s``: a receipt in
its session, then a delegation (the parent's runtime opens a grant, the child's accepts it naming the
parent's replicas, its own zone's first). A parent record takes ``budget`` children; then one more
delegation is tried, which its signers must refuse (``FANOUT_EXCEEDED``), and a new parent record is
issued. The pairs are deployer-a -> b, b -> c and c -> a, each in the two zones of its deployers, so
every replica in every zone serves runtimes and co-signs.

The faults (:data:`FAULTS`), each under that load after a baseline:

* ``partition``: zone-a (a coordinator and the first replica of deployer-a) cut off from the other zones;
* ``kill-signer``: SIGKILL of deployer-a's replica in zone-a (its zone's runtimes' first choice, and the
  parent its zone's delegations ask first); restarted after the window;
* ``rolling-restart``: every signer replica, one at a time: SIGTERM, wait for the exit, start again,
  wait until it serves, next (nine of them);
* ``kill-coordinator``: SIGKILL of the coordinator in zone-a (followed first by zones a and c);
  restarted after the window. The window is longer than the followers' ``staleness_ms``: a follower
  that did not move to the other coordinator would go stale and its signer refuse.

Beside them (:data:`VARIANTS`, not held to the targets): ``partition-zone-unaware``, the same partition
with runtimes and ``parent_signer`` naming the replicas home zone first from every zone, as a client that
knows nothing of zones would: what a call that crosses the partition costs.

What is counted (:class:`FaultResult`): signing calls the runtimes saw fail after the SDK's failover;
duplicated or skipped ``seq`` per session (the receipts the runtimes got, against the store's own
count, and every session verified whole by a verifier's ``VerifySession``); grants spent on more than
one edge (children under a parent record against its spent grants, in the parent's store); children
over a parent's budget (in the store, and budget-exceeding delegations that were answered); and the
p99 of receipts and of delegations started during the fault against those started in the baseline.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path as FilePath

import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from countersign.client import ServiceError, SignerClient
from countersign.records import Path
from countersign.sessions import SessionEvidence
from tools.zones.measure import percentile
from tools.zones.mesh import DEFAULT_POSTGRES_URL, DEPLOYERS, ZONES, ZoneMesh
from tools.zones.net import check_namespaces

FAULTS = ("partition", "kill-signer", "rolling-restart", "kill-coordinator")
# Shown beside them, not held to the targets: what the same partition costs clients that ignore zones.
VARIANTS = ("partition-zone-unaware",)
RUN_ORDER = ("partition", "partition-zone-unaware", "kill-signer", "rolling-restart", "kill-coordinator")
FAULT_LABELS = {
    "partition": "(a) zone-a partitioned from b and c",
    "partition-zone-unaware": "(a′) as (a), runtimes and parent_signer naming replicas home zone first",
    "kill-signer": "(b) SIGKILL deployer-a's replica in zone-a",
    "rolling-restart": "(c) rolling restart of all 9 signer replicas",
    "kill-coordinator": "(d) SIGKILL the coordinator in zone-a",
}
PARTITIONED_ZONE = "a"
KILLED_SIGNER = "deployer-a"  # zone-a
KILLED_COORDINATOR = "coordinator"  # zone-a
# (parent, child): each pair's runtimes run in the zones of both its deployers' first replicas.
PAIRS = (("deployer-a", "deployer-b"), ("deployer-b", "deployer-c"), ("deployer-c", "deployer-a"))
# Followers must notice a lost coordinator well within staleness_ms (three heartbeats of silence).
STALENESS_MS = 6_000
HEARTBEAT_MS = 500
SESSION_RECEIPTS = 100  # receipts per session before the agent starts the next one
P99_TARGET_RATIO = 3.0
# Read from the signer state's tables (signer/stores/migrations/postgres).
CHILDREN_SQL = "SELECT parent, count(*) FROM children WHERE parent = ANY(%s) GROUP BY parent"
SPENT_GRANTS_SQL = (
    "SELECT parent, count(*) FROM grants WHERE parent = ANY(%s) AND manifest_digest IS NOT NULL GROUP BY parent"
)
SESSION_HEADS_SQL = "SELECT session, seq FROM agent_sessions WHERE agent = %s"


@dataclass(frozen=True)
class Call:
    kind: str  # "receipt", "delegation" (open grant + accept) or "budget" (the one past the budget)
    started: float  # time.monotonic() when the runtime made the call
    elapsed_ms: float
    code: str  # "OK", or the code the runtime saw after the SDK's failover


@dataclass
class Parent:
    path: Path
    accepted: list[tuple[str, Path]] = field(default_factory=list)  # (grant id, the child record's path)
    past_budget: str = ""  # what the delegation past the budget was answered: its error code, or "OK"


@dataclass
class Agent:
    """One agent's load: a parent deployer's runtime and a child deployer's, in one zone."""

    zone: str
    parent: str
    child: str
    parents: list[Parent] = field(default_factory=list)
    sessions: dict[str, list[tuple[bytes, Path]]] = field(default_factory=dict)  # session -> (output, receipt)
    agent: Path | None = None

    @property
    def name(self) -> str:
        return f"{self.zone}-{self.parent.removeprefix('deployer-')}{self.child.removeprefix('deployer-')}"


class Load:
    """A steady delegation-and-receipt load from runtimes in every zone (module docstring)."""

    def __init__(self, zoned: ZoneMesh, *, period_s: float = 0.25, budget: int = 6, zone_aware: bool = True) -> None:
        self.zoned = zoned
        self.zone_aware = zone_aware
        self.period_s = period_s
        self.budget = budget
        self.calls: list[Call] = []
        self.agents = [
            Agent(zone, parent, child)
            for parent, child in PAIRS
            for zone in (zoned.zone_of(parent), zoned.zone_of(child))
        ]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[BaseException] = []  # a worker that died of something other than a ServiceError

    def start(self) -> Load:
        ready = threading.Barrier(len(self.agents) + 1)
        for agent in self.agents:
            thread = threading.Thread(target=self._run, args=(agent, ready), name=f"load-{agent.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        ready.wait(timeout=60)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        if any(thread.is_alive() for thread in self._threads):
            raise RuntimeError("a load worker did not stop within 60 s")

    def _record(self, kind: str, started: float, code: str) -> None:
        call = Call(kind, started, (time.monotonic() - started) * 1000, code)
        with self._lock:
            self.calls.append(call)

    def _run(self, agent: Agent, ready: threading.Barrier) -> None:
        zoned = self.zoned
        aware = self.zone_aware
        parent_rt = zoned.runtime(agent.parent, zone=agent.zone, own_zone_first=aware)
        child_rt = zoned.runtime(agent.child, zone=agent.zone, own_zone_first=aware)
        parent_signer = zoned.signer_addresses(agent.parent, from_zone=agent.zone, own_zone_first=aware)
        try:
            agent.agent = child_rt.root(f"writer-{agent.name}", "zones-faults", max_children=1)
            agent.parents.append(self._new_parent(parent_rt, agent, 0))
            ready.wait(timeout=60)
            turn, tick = 0, time.monotonic()
            while not self._stop.is_set():
                self._receipt(child_rt, agent, turn)
                parent = agent.parents[-1]
                self._delegation(parent_rt, child_rt, agent, parent, parent_signer, f"{agent.name}-{turn}")
                if len(parent.accepted) >= self.budget:
                    self._past_budget(parent_rt, child_rt, agent, parent, parent_signer, f"{agent.name}-{turn}-over")
                    agent.parents.append(self._new_parent(parent_rt, agent, len(agent.parents)))
                turn += 1
                tick += self.period_s
                self._stop.wait(max(0.0, tick - time.monotonic()))
        except BaseException as exc:  # the test reads it: a worker must not die silently
            self.errors.append(exc)
            raise
        finally:
            parent_rt.close()
            child_rt.close()

    def _new_parent(self, parent_rt: SignerClient, agent: Agent, index: int) -> Parent:
        # Issued outside the measured calls: the load counts receipts and delegations.
        for _ in range(50):
            try:
                return Parent(parent_rt.root(f"planner-{agent.name}-{index}", "zones-faults", max_children=self.budget))
            except ServiceError:
                if self._stop.wait(0.2):
                    break
        raise RuntimeError(f"{agent.name}: no parent record could be issued")

    def _receipt(self, child_rt: SignerClient, agent: Agent, turn: int) -> None:
        assert agent.agent is not None
        session = f"{agent.name}-s{turn // SESSION_RECEIPTS}"
        output = f"{agent.name} output {turn}".encode()
        started = time.monotonic()
        try:
            receipt = child_rt.receipt(agent.agent, hashlib.sha256(output).digest(), session=session)
        except ServiceError as error:
            self._record("receipt", started, error.code)
            return
        self._record("receipt", started, "OK")
        agent.sessions.setdefault(session, []).append((output, receipt))

    def _delegation(
        self,
        parent_rt: SignerClient,
        child_rt: SignerClient,
        agent: Agent,
        parent: Parent,
        parent_signer: str,
        instance: str,
    ) -> None:
        started = time.monotonic()
        try:
            grant = parent_rt.open_grant(parent.path, agent.child)
            child = child_rt.accept(parent.path, grant, parent_signer, instance)
        except ServiceError as error:
            self._record("delegation", started, error.code)
            return
        self._record("delegation", started, "OK")
        parent.accepted.append((grant.grant_id, child))

    def _past_budget(
        self,
        parent_rt: SignerClient,
        child_rt: SignerClient,
        agent: Agent,
        parent: Parent,
        parent_signer: str,
        instance: str,
    ) -> None:
        """One delegation more than the parent record allows: its signers must refuse it."""
        started = time.monotonic()
        try:
            grant = parent_rt.open_grant(parent.path, agent.child)
            child_rt.accept(parent.path, grant, parent_signer, instance)
        except ServiceError as error:
            parent.past_budget = error.details.get("parent_code") or error.code
            self._record("budget", started, "OK" if parent.past_budget == "FANOUT_EXCEEDED" else error.code)
            return
        parent.past_budget = "OK"
        self._record("budget", started, "ANSWERED_PAST_BUDGET")

    def between(self, kind: str, start: float, end: float) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.kind == kind and start <= c.started < end]


class FreshnessProbe:
    """Reads every running signer's registry freshness from its metrics, every ``interval_s``: a signer
    whose copy goes stale refuses to sign (``REGISTRY_STALE``, retried by the SDK at another replica),
    so a follower that did not move to the other coordinator shows here even when no call failed."""

    def __init__(self, zoned: ZoneMesh, *, interval_s: float = 0.5) -> None:
        self.zoned = zoned
        self.interval_s = interval_s
        self.samples = 0
        self.stale: list[tuple[float, str]] = []  # (monotonic time, signer) of each stale reading
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freshness-probe", daemon=True)

    def start(self) -> FreshnessProbe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        staleness_s = self.zoned.staleness_ms / 1000
        while not self._stop.wait(self.interval_s):
            for name, daemon in list(self.zoned.local.daemons.items()):
                if daemon.kind != "signer" or not daemon.alive or not daemon.metrics_port:
                    continue
                gauges = registry_gauges(daemon.host, daemon.metrics_port)
                if gauges is None:
                    continue  # starting or stopping: not serving, so not signing either
                self.samples += 1
                age, expires_in = gauges
                if age > staleness_s or expires_in <= 0:
                    self.stale.append((time.monotonic(), name))


def registry_gauges(host: str, port: int) -> tuple[float, float] | None:
    """(seconds since the last trusted heartbeat, seconds until the held checkpoint expires) from a
    daemon's metrics; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return None
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = sample.value
    try:
        return values["countersign_registry_staleness_seconds"], values[
            "countersign_registry_checkpoint_expires_in_seconds"
        ]
    except KeyError:
        return None


# --- what the stores hold -----------------------------------------------------------------------


def _rows(zoned: ZoneMesh, deployer: str, query: str, args: tuple[object, ...]) -> list[tuple[str, int]]:
    """Rows of (text, count) from ``deployer``'s signer state (the schema its replicas share)."""
    with psycopg.connect(zoned.postgres_url, connect_timeout=5, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(zoned.signer_schema(deployer))))
        return [(str(key), int(count)) for key, count in conn.execute(query.encode(), args).fetchall()]


def children_of(zoned: ZoneMesh, deployer: str, parents: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Per parent record (digest): (children the parent's signers counted, grants spent on an edge)."""
    wanted = (list(parents),)
    counted = dict(_rows(zoned, deployer, CHILDREN_SQL, wanted))
    spent = dict(_rows(zoned, deployer, SPENT_GRANTS_SQL, wanted))
    return {p: (counted.get(p, 0), spent.get(p, 0)) for p in parents}


def session_heads(zoned: ZoneMesh, deployer: str, agent: str) -> dict[str, int]:
    """The last ``seq`` the deployer's store holds for each session of the agent record ``agent``."""
    return dict(_rows(zoned, deployer, SESSION_HEADS_SQL, (agent,)))


# --- one fault ------------------------------------------------------------------------------------


@dataclass
class FaultResult:
    fault: str
    calls: int = 0  # signing calls the runtimes made (receipts, grants and accepts count as calls made)
    failed: int = 0  # ... that failed after the SDK's failover
    failed_codes: dict[str, int] = field(default_factory=dict)
    seq_duplicated: int = 0
    seq_skipped: int = 0
    sessions: int = 0
    sessions_rejected: int = 0  # sessions a verifier did not accept whole
    sessions_verified: int = 0  # sessions a verifier accepted whole
    grants_used_twice: int = 0
    over_budget: int = 0
    budget_refused: int = 0  # delegations past a budget, refused as they must be
    orphan_children: int = 0  # children counted in a store that no runtime received (only after failures)
    # What the checks read, so that a check reading nothing cannot pass unseen:
    children_received: int = 0  # child records the runtimes received
    children_counted: int = 0  # children the parents' stores counted under the same parent records
    grants_spent: int = 0  # grants the parents' stores hold as spent under them
    sessions_stored: int = 0  # sessions whose head the children's stores hold
    freshness_samples: int = 0  # signers' registry freshness read while the load ran
    stale_signers: list[str] = field(default_factory=list)  # signers found stale (each once)
    receipts_before: list[float] = field(default_factory=list)
    receipts_during: list[float] = field(default_factory=list)
    delegations_before: list[float] = field(default_factory=list)
    delegations_during: list[float] = field(default_factory=list)
    fault_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def p99(self, values: list[float]) -> float:
        return percentile(values, 99)

    @property
    def ratios(self) -> tuple[float, float]:
        """p99 during ÷ p99 before, for receipts and for delegations."""
        r = self.p99(self.receipts_during) / self.p99(self.receipts_before)
        d = self.p99(self.delegations_during) / self.p99(self.delegations_before)
        return r, d

    @property
    def worst_ratio(self) -> float:
        return max(self.ratios)

    @property
    def noise_ratio(self) -> float:
        """The same worst p99 ratio between the baseline's second half and its first, with no fault:
        how far the tail moves on this host by itself, to read the fault's ratio against."""
        ratios = []
        for values in (self.receipts_before, self.delegations_before):
            half = len(values) // 2
            if half:
                ratios.append(self.p99(values[half:]) / self.p99(values[:half]))
        return max(ratios, default=float("nan"))

    @property
    def correct(self) -> bool:
        """The correctness targets: nothing failed, no seq repeated or skipped, no grant twice, no budget exceeded."""
        return not (
            self.failed or self.seq_duplicated or self.seq_skipped or self.sessions_rejected
            or self.grants_used_twice or self.over_budget or self.stale_signers
        )  # fmt: skip


@contextmanager
def _fault_window(zoned: ZoneMesh, fault: str, fault_s: float, log: Callable[[str], None]) -> Iterator[None]:
    """Inject ``fault``; the block runs while it lasts; then heal or restart what it took."""
    local = zoned.local
    if fault in ("partition", "partition-zone-unaware"):
        with zoned.partitioned(PARTITIONED_ZONE):
            log(f"  zone-{PARTITIONED_ZONE} partitioned")
            yield
        log("  healed")
    elif fault in ("kill-signer", "kill-coordinator"):
        name = KILLED_SIGNER if fault == "kill-signer" else KILLED_COORDINATOR
        local.kill(name)
        log(f"  {name} SIGKILLed")
        try:
            yield
        finally:
            local.start(name)
            log(f"  {name} restarted")
    elif fault == "rolling-restart":
        for deployer in DEPLOYERS:
            for name in zoned.signer_names(deployer):
                code = local.stop(name, timeout_s=30)
                local.start(name, timeout_s=60)
                log(f"  {name} restarted (exit code {code})")
        yield
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(FAULTS + VARIANTS)}")


def run_fault(
    zoned: ZoneMesh,
    fault: str,
    *,
    baseline_s: float = 10.0,
    fault_s: float = 10.0,
    recovery_s: float = 4.0,
    warmup_s: float = 3.0,
    period_s: float = 0.25,
    log: Callable[[str], None] = lambda message: None,
) -> FaultResult:
    """Run the load, inject ``fault`` after a baseline, and count what it cost (module docstring).
    ``fault_s`` is how long a partition or a killed daemon lasts; a rolling restart lasts as long as
    it takes."""
    load = Load(zoned, period_s=period_s, zone_aware=fault != "partition-zone-unaware").start()
    probe = FreshnessProbe(zoned).start()
    try:
        time.sleep(warmup_s)
        baseline_start = time.monotonic()
        time.sleep(baseline_s)
        fault_start = time.monotonic()
        log(f"[{fault}] baseline done ({len(load.calls)} calls so far)")
        with _fault_window(zoned, fault, fault_s, log):
            if fault != "rolling-restart":
                time.sleep(fault_s)
            fault_end = time.monotonic()
        time.sleep(recovery_s)
    finally:
        probe.stop()
        load.stop()
    if load.errors:
        raise RuntimeError(f"a load worker died: {load.errors[0]!r}") from load.errors[0]
    result = FaultResult(fault, fault_s=fault_end - fault_start)
    result.freshness_samples = probe.samples
    result.stale_signers = sorted({name for _, name in probe.stale})
    for kind, before, during in (
        ("receipt", result.receipts_before, result.receipts_during),
        ("delegation", result.delegations_before, result.delegations_during),
    ):
        before += [c.elapsed_ms for c in load.between(kind, baseline_start, fault_start) if c.code == "OK"]
        during += [c.elapsed_ms for c in load.between(kind, fault_start, fault_end) if c.code == "OK"]
    check(zoned, load, result)
    return result


def check(zoned: ZoneMesh, load: Load, result: FaultResult) -> None:
    """Count failures, seq gaps and repeats, grants used twice and budgets exceeded into ``result``."""
    for call in load.calls:
        if call.kind == "budget":
            if call.code == "ANSWERED_PAST_BUDGET":
                continue  # counted below, from the parents
            if call.code == "OK":
                result.budget_refused += 1
                continue
        result.calls += 2 if call.kind == "delegation" else 1  # a delegation is an OpenGrant and an accept
        if call.code != "OK":
            result.failed += 1
            result.failed_codes[call.code] = result.failed_codes.get(call.code, 0) + 1
    verifier = zoned.verifier_client(0)
    try:
        for agent in load.agents:
            assert agent.agent is not None
            heads = session_heads(zoned, agent.child, agent.agent.leaf.digest())
            result.sessions_stored += len(heads.keys() & agent.sessions.keys())
            for session, receipts in agent.sessions.items():
                result.sessions += 1
                seqs = [r.leaf.record.output.seq for _, r in receipts]  # type: ignore[union-attr]
                result.seq_duplicated += len(seqs) - len(set(seqs))
                # The store's own head counts receipts issued that no runtime received.
                last = max(heads.get(session, -1), *seqs)
                result.seq_skipped += last + 1 - len(set(seqs))
                ordered = sorted(receipts, key=lambda item: item[1].leaf.record.output.seq)  # type: ignore[union-attr]
                evidence = SessionEvidence(agent.agent, tuple(r.leaf for _, r in ordered))
                if len(set(seqs)) != len(seqs):
                    continue  # counted as repeated; a session with a repeat is not one chain to verify
                if verifier.verify_session(evidence, [output for output, _ in ordered], audit=True):
                    result.sessions_verified += 1
                else:
                    result.sessions_rejected += 1
            digests = {p.path.leaf.digest(): p for p in agent.parents}
            for digest, (children, spent) in children_of(zoned, agent.parent, list(digests)).items():
                parent = digests[digest]
                received = {grant for grant, _ in parent.accepted}
                result.grants_used_twice += max(0, children - spent) + len(parent.accepted) - len(received)
                result.over_budget += max(0, children - load.budget) + (parent.past_budget == "OK")
                result.orphan_children += max(0, children - len(parent.accepted))
                result.children_received += len(parent.accepted)
                result.children_counted += children
                result.grants_spent += spent
    finally:
        verifier.close()


# --- the command -----------------------------------------------------------------------------------


def replica_mesh(workdir: FilePath, *, postgres_url: str = DEFAULT_POSTGRES_URL, delay_ms: float = 0.5) -> ZoneMesh:
    """The three-zone mesh of replicas the faults run on (not started)."""
    return ZoneMesh(
        workdir,
        delay_ms=delay_ms,
        signer_replicas=len(ZONES),
        coordinators=2,
        staleness_ms=STALENESS_MS,
        heartbeat_ms=HEARTBEAT_MS,
        postgres_url=postgres_url,
        store_connect_timeout_s=5,
    )


def _p99(values: list[float]) -> str:
    return f"{percentile(values, 99):.1f}" if values else "—"


def report(results: Sequence[FaultResult], *, command: str, load: str) -> str:
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured {today} on {platform.node()} ({os.cpu_count()} CPUs, Python {platform.python_version()}),"
        f" `{command}`; load average before the run {load}. Three signer replicas per deployer (one per zone,"
        " PostgreSQL state), two coordinators (PostgreSQL log), 0.5 ms one way between zones, mTLS; runtimes"
        f" use the SDK's default RetryPolicy; followers' staleness_ms {STALENESS_MS}.",
        "",
        "| fault | signing calls | failed after failover | seq repeated / skipped | grants used twice"
        " | children over budget | receipt p99 ms before → during | delegation p99 ms before → during"
        f" | p99 ratio (target ≤ {P99_TARGET_RATIO:g}×) | the same ratio between the baseline's halves (no fault)"
        " | slowest call during ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        codes = ", ".join(f"{code} {count}" for code, count in sorted(r.failed_codes.items()))
        failed = f"{r.failed} ({codes})" if r.failed else "0"
        seq = f"{r.seq_duplicated} / {r.seq_skipped}"
        if r.sessions_rejected:
            seq += f" ({r.sessions_rejected} sessions rejected)"
        ratio = r.worst_ratio
        verdict = "" if ratio <= P99_TARGET_RATIO else " ABOVE"
        lines.append(
            f"| {FAULT_LABELS[r.fault]} ({r.fault_s:.0f} s) | {r.calls} | {failed} | {seq} | {r.grants_used_twice}"
            f" | {r.over_budget} | {_p99(r.receipts_before)} → {_p99(r.receipts_during)}"
            f" | {_p99(r.delegations_before)} → {_p99(r.delegations_during)} | {ratio:.2f}×{verdict}"
            f" | {r.noise_ratio:.2f}× | {max(r.receipts_during + r.delegations_during, default=float('nan')):.0f} |"
        )  # fmt: skip
    lines.append("")
    lines += [
        f"- {FAULT_LABELS[r.fault]}: {r.sessions_verified} of {r.sessions} sessions verified whole,"
        f" {r.budget_refused} delegations past a budget refused FANOUT_EXCEEDED,"
        f" {r.orphan_children} children counted that no runtime received,"
        f" signers found stale {', '.join(r.stale_signers) or 'none'} in {r.freshness_samples} readings;"
        f" samples before/during: receipts {len(r.receipts_before)}/{len(r.receipts_during)}, delegations"
        f" {len(r.delegations_before)}/{len(r.delegations_during)}"
        for r in results
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.zones faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=RUN_ORDER, action="append", help="run only this (repeatable)")
    parser.add_argument("--baseline-s", type=float, default=10.0)
    parser.add_argument("--fault-s", type=float, default=10.0, help="how long a partition or a kill lasts")
    parser.add_argument("--period-s", type=float, default=0.25, help="each agent's pace (a receipt and a delegation)")
    parser.add_argument("--postgres-url", default=DEFAULT_POSTGRES_URL)
    args = parser.parse_args(argv)
    check_namespaces()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results = []
    for fault in args.only or RUN_ORDER:
        with (
            tempfile.TemporaryDirectory(prefix="zones-faults-") as workdir,
            replica_mesh(FilePath(workdir), postgres_url=args.postgres_url) as zoned,
        ):
            log(f"[{fault}] zones up ({zoned.delay_mode})")
            results.append(
                run_fault(
                    zoned, fault, baseline_s=args.baseline_s, fault_s=args.fault_s, period_s=args.period_s, log=log
                )
            )
    command = "python -m tools.zones faults " + " ".join(argv if argv is not None else sys.argv[2:])
    print(report(results, command=command.strip(), load=load))
    return 0 if all(r.correct for r in results if r.fault in FAULTS) else 1
