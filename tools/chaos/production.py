"""Production's faults in an `eo chaos` campaign (`--production`): the campaign runs on a
RabbitMQ cluster and a synchronous PostgreSQL primary and standby of its own
(tools/faults), and a run's plan draws, besides its kills and failpoints, faults of those
servers at marks of its progress (`KINDS`). Each fault is undone a few seconds later (a node
restarted or resumed, the old primary rejoining as standby), and every one is undone before
the run stops, so that each run ends on a whole cluster and pair. What happened is kept as
`FaultRecord`s, times from the run's start."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import SecretStr

from entrypoints.settings import Settings
from tools.faults.pg_pair import PostgresPair
from tools.faults.pg_pair import available as pair_available
from tools.faults.rabbit_cluster import RabbitCluster
from tools.faults.rabbit_cluster import available as cluster_available

#: the faults a plan draws, and how long each lasts before it is undone (seconds)
KINDS: dict[str, float] = {
    "rabbitmq leader killed": 5.0,  # kill -9 of the node leading a work queue, restarted
    "rabbitmq node paused": 15.0,  # SIGSTOP past the distribution's tick, then SIGCONT
    "postgresql failover": 3.0,  # kill -9 of the primary, standby promoted, old one rejoins
    "postgresql restart": 0.0,  # pg_ctl restart -m immediate of the primary
}


def unavailable() -> str | None:
    """Why this machine cannot run the campaign's servers, or None."""
    return cluster_available() or pair_available()


@dataclass
class FaultRecord:
    """One fault: its kind, what it hit, when (seconds from the run's start) and how long
    until it was undone."""

    kind: str
    target: str
    at_s: float
    lasted_s: float | None = None

    def line(self) -> str:
        """The report's line: `12.3 s rabbitmq leader killed: <node> (undone after 5.0 s)`."""
        undone = "" if self.lasted_s is None else f" (undone after {self.lasted_s:.1f} s)"
        return f"{self.at_s:.1f} s {self.kind}: {self.target}{undone}"


@dataclass
class ProductionServers:
    """The campaign's cluster and pair, and the faults of the run under way."""

    cluster: RabbitCluster = field(default_factory=RabbitCluster)
    pair: PostgresPair = field(default_factory=PostgresPair)
    records: list[FaultRecord] = field(default_factory=list)
    #: the undoings under way, with the servers they concern ("rabbitmq", "postgresql")
    _undoing: list[tuple[str, asyncio.Task[None]]] = field(default_factory=list)
    _started: float = 0.0

    async def start(self) -> None:
        """Start the cluster and the pair (together: about 20 s here)."""
        await asyncio.gather(self.cluster.start(), self.pair.start())

    async def remove(self) -> None:
        """Undo what is under way and remove both (directories included)."""
        await self.restore()
        await asyncio.gather(self.cluster.remove(), self.pair.remove())

    def settings(self, base: Settings) -> Settings:
        """`base` pointing at the cluster (its first node, the others as addresses) and at
        the pair's `postgres` database through its multi-host DSN."""
        first, *others = self.cluster.nodes
        return base.replaced(amqp_url=SecretStr(first.url),
                             amqp_addresses=tuple(n.address for n in others),
                             database_dsn=SecretStr(self.pair.dsn("postgres")))

    def begin_run(self) -> None:
        """A run starts: its records start empty, times count from now."""
        self.records, self._started = [], time.monotonic()

    async def inject(self, kind: str, queues: tuple[str, ...], rng: random.Random) -> None:
        """Inject fault `kind` now (its undoing scheduled `KINDS[kind]` seconds later), once
        the undoing of an earlier fault of the same servers has run (a second failover
        before the first one's old primary rejoined would promote a server that never had
        the new primary's commits: a double fault the template does not claim to survive).
        A fault that cannot be injected is recorded as such (the campaign's tooling, not the
        service, failed)."""
        await self._undone(kind.split()[0])
        at = time.monotonic() - self._started
        try:
            record = await self._inject(kind, queues, rng, at)
        except RuntimeError as exc:
            record = FaultRecord(kind, f"not injected: {exc}", at, 0.0)
        self.records.append(record)

    async def _undone(self, servers: str) -> None:
        for family, task in self._undoing:
            if family == servers:
                with contextlib.suppress(Exception):  # failed: `restore` redoes it
                    await task

    async def _inject(self, kind: str, queues: tuple[str, ...], rng: random.Random,
                      at: float) -> FaultRecord:
        if kind == "rabbitmq leader killed":
            queue = rng.choice(queues)
            try:
                node = self.cluster.node(await self.cluster.leader_of(queue))
                target = f"{node.name}, leader of {queue}"
            except RuntimeError:  # an election under way: a node all the same
                node = rng.choice([n for n in self.cluster.nodes if n.running and not n.paused])
                target = f"{node.name} ({queue} had no leader to name)"
            await self.cluster.kill(node)
            record = FaultRecord(kind, target, at)
            self._later(record, lambda: self.cluster.restart(node))
        elif kind == "rabbitmq node paused":
            node = rng.choice([n for n in self.cluster.nodes if n.running and not n.paused])
            await self.cluster.pause(node)
            record = FaultRecord(kind, node.name, at)
            self._later(record, lambda: self.cluster.resume(node))
        elif kind == "postgresql failover":
            old = self.pair.primary
            await self.pair.failover()
            record = FaultRecord(kind, f"{old.name} -> {self.pair.primary.name}", at)
            self._later(record, self._rejoin)
        elif kind == "postgresql restart":
            await self.pair.restart_immediate(self.pair.primary)
            record = FaultRecord(kind, self.pair.primary.name, at,
                                 time.monotonic() - self._started - at)
        else:
            raise ValueError(f"unknown fault {kind!r}")
        return record

    async def _rejoin(self) -> None:
        await self.pair.rejoin()

    def _later(self, record: FaultRecord, undo: Callable[[], Awaitable[None]]) -> None:
        async def undo_after() -> None:
            await asyncio.sleep(KINDS[record.kind])
            await undo()
            record.lasted_s = time.monotonic() - self._started - record.at_s
        self._undoing.append((record.kind.split()[0], asyncio.create_task(undo_after())))

    async def messages(self, queues: list[str]) -> int:
        """Messages in `queues`, ready or delivered and not yet acked, as the cluster counts
        them (`rabbitmqctl list_queues name messages` on a running node; a queue that does
        not exist counts 0). Raises RuntimeError when no node answers."""
        wanted, total, failure = set(queues), 0, None
        for node in self.cluster.nodes:
            if not node.running or node.paused:
                continue
            try:
                out = await self.cluster.ctl(node, "list_queues", "name", "messages",
                                             "--no-table-headers", timeout_s=20)
            except RuntimeError as exc:
                failure = exc
                continue
            for line in out.splitlines():
                name, _, count = line.partition("\t")
                if name in wanted and count.strip().isdigit():
                    total += int(count)
            return total
        raise failure or RuntimeError("no running node to ask")

    @property
    def pending(self) -> bool:
        """Whether a fault's undoing has yet to run."""
        return any(not task.done() for _, task in self._undoing)

    async def restore(self) -> None:
        """Once every fault's undoing has run (a run is about to stop: at most `KINDS`'
        longest wait), make sure the cluster and the pair are whole again."""
        undoing, self._undoing = self._undoing, []
        for _, task in undoing:
            with contextlib.suppress(Exception):  # an undoing that failed: done below
                await task
        for node in self.cluster.nodes:
            if node.paused:
                await self.cluster.resume(node)
            if not node.running:
                await self.cluster.restart(node)
        if self.pair.standby.postmaster_pid() is None:
            await self.pair.rejoin()
        for record in self.records:
            if record.lasted_s is None:
                record.lasted_s = time.monotonic() - self._started - record.at_s
