"""Production's faults in an `eo chaos` campaign (`--production`): the campaign runs on a
RabbitMQ cluster and a PostgreSQL primary and standby of its own (synchronous, unless
`--asynchronous-standby`), with the services' processes in a network namespace of their own
(tools/faults), and a run's plan draws, besides its kills and failpoints, faults of those
servers and of that network at marks of its progress (`KINDS`). Each fault is undone a few
seconds later (a node restarted or resumed, the old primary rejoining as standby, the
network healed), and every one is undone before the run stops, so that each run ends on a
whole cluster, pair and network. What happened is kept as `FaultRecord`s, times from the
run's start, with what the services did in each fault's window."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from entrypoints.settings import Settings
from tools.faults.network import Namespace
from tools.faults.network import available as network_available
from tools.faults.pg_pair import PostgresPair
from tools.faults.pg_pair import available as pair_available
from tools.faults.rabbit_cluster import RabbitCluster
from tools.faults.rabbit_cluster import available as cluster_available

#: the faults a plan draws, and how long each lasts before it is undone (seconds)
KINDS: dict[str, float] = {
    "rabbitmq leader killed": 5.0,  # kill -9 of the node leading a work queue, restarted
    "rabbitmq node paused": 15.0,  # SIGSTOP past the distribution's tick, then SIGCONT
    "postgresql failover": 3.0,  # kill -9 of the primary, standby promoted, old one rejoins
    # the standby stopped `LAG_S` (a network cut, a slow disk), then the primary killed and
    # the standby promoted: what it lacks is lost unless replication is synchronous
    "postgresql failover, standby lagging": 3.0,
    "postgresql restart": 0.0,  # pg_ctl restart -m immediate of the primary
    # the consumers' network namespace (tools/faults/network.py), healed after:
    "network slow": 10.0,  # a 256 kbit/s link both ways
    "network lossy": 10.0,  # 20 % of the packets lost both ways
    "network one-way cut": 6.0,  # every packet to the servers, or every reply, dropped
    "network cut from the broker": 10.0,  # the broker's ports only: the database answers
}
#: how long the standby lags before the failover of "postgresql failover, standby lagging"
LAG_S = 5.0
#: the network faults' figures
SLOW_KBIT, LOSS_PERCENT = 256, 20


def unavailable() -> str | None:
    """Why this machine cannot run the campaign's servers, or None."""
    return cluster_available() or pair_available()


@dataclass
class FaultRecord:
    """One fault: its kind, what it hit, when (seconds from the run's start, and the wall
    clock's time) and how long until it was undone; then what the services did
    (`reactions`, tools/chaos/reactions.py)."""

    kind: str
    target: str
    at_s: float
    lasted_s: float | None = None
    wall_at: float = field(default_factory=time.time)
    #: the window (wall clock) in which a lagging standby missed the primary's commits
    lag: tuple[float, float] | None = None
    reactions: str = ""

    def line(self) -> str:
        """The report's line: `12.3 s rabbitmq leader killed: <node> (undone after 5.0 s)`,
        then what the services did."""
        undone = "" if self.lasted_s is None else f" (undone after {self.lasted_s:.1f} s)"
        then = f"; {self.reactions}" if self.reactions else ""
        return f"{self.at_s:.1f} s {self.kind}: {self.target}{undone}{then}"


class ProductionServers:
    """The campaign's cluster and pair, the consumers' network namespace (where this machine
    can make one: `network`), and the faults of the run under way.

    With the namespace, the services' processes run in it (`zygote_wrapper`) and reach the
    servers at its host end (`process_env`): the cluster, the pair, the S3 API and the
    third-party APIs' providers listen there too (`serving_host`), and the network faults
    concern the consumers' links alone; the campaign's own connections (publishing, counting,
    checking) stay on 127.0.0.1."""

    def __init__(self, synchronous: bool = True, network: bool = True) -> None:
        """`synchronous`: the pair's replication (asynchronous: a failover may lose acknowledged
        commits, which the campaign then reports); `network`: make the namespace when this
        machine can (tools/faults/network.py `available`)."""
        self.network = Namespace() if network and network_available() is None else None
        also_on = self.network.host_address if self.network is not None else None
        self.cluster = RabbitCluster(also_on=also_on)
        self.pair = PostgresPair(synchronous=synchronous, also_on=also_on)
        self.records: list[FaultRecord] = []
        #: the undoings under way, with the servers they concern ("rabbitmq", ...)
        self._undoing: list[tuple[str, asyncio.Task[None]]] = []
        self._started = 0.0

    @property
    def kinds(self) -> tuple[str, ...]:
        """The faults this campaign can inject (the network's only with the namespace)."""
        return tuple(k for k in KINDS if self.network is not None or not k.startswith("network"))

    @property
    def serving_host(self) -> str:
        """Where the campaign's S3 API and providers listen: the namespace's host end, or
        127.0.0.1."""
        return self.network.host_address if self.network is not None else "127.0.0.1"

    def zygote_wrapper(self) -> tuple[str, ...]:
        """The command the services' zygote runs under: the namespace's, or none."""
        return tuple(self.network.command()) if self.network is not None else ()

    async def start(self) -> None:
        """Make the namespace, then start the cluster and the pair (together: about 20 s
        here)."""
        if self.network is not None:
            await self.network.create()
        await asyncio.gather(self.cluster.start(), self.pair.start())

    async def remove(self) -> None:
        """Undo what is under way and remove everything (directories included)."""
        try:
            await self.restore()
        finally:
            await asyncio.gather(self.cluster.remove(), self.pair.remove())
            if self.network is not None:
                await self.network.remove()

    def settings(self, base: Settings) -> Settings:
        """`base` pointing at the cluster (its first node, the others as addresses) and at
        the pair's `postgres` database through its multi-host DSN."""
        first, *others = self.cluster.nodes
        return base.replaced(amqp_url=SecretStr(first.url),
                             amqp_addresses=tuple(n.address for n in others),
                             database_dsn=SecretStr(self.pair.dsn("postgres")))

    def process_env(self, settings: Settings, callees: tuple[str, ...]) -> dict[str, str]:
        """The services' processes' broker and database settings as seen from the
        namespace (none without one): `settings`' (the campaign's, on 127.0.0.1) with the
        namespace's host end for address; `callees` listen on the namespace's own address,
        where the campaign's final sweep reaches them."""
        if self.network is None:
            return {}
        host = self.network.host_address
        name = settings.database().rsplit("/", 1)[1].split("?", 1)[0]
        first, *others = self.cluster.nodes
        vhost = settings.amqp().rsplit("/", 1)[1]
        return {"EO_DATABASE_DSN": self.pair.dsn(name, host),
                "EO_AMQP_URL": first.url_on(host) + vhost,
                "EO_AMQP_ADDRESSES": json.dumps([f"{host}:{n.amqp_port}" for n in others]),
                **{f"EO_CALLEES__{callee.upper()}__HOST": self.network.inner_address
                   for callee in callees}}

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
        elif kind == "postgresql failover, standby lagging":
            await self.pair.stop_standby()
            lagging = self.pair.standby.name
            record = FaultRecord(kind, f"{lagging} stopped {LAG_S:.0f} s, then "
                                       f"{self.pair.primary.name} killed", at)
            record.lag = (record.wall_at, record.wall_at)

            async def fail_over_then_rejoin() -> None:
                await asyncio.sleep(LAG_S)
                assert record.lag is not None
                record.lag = (record.lag[0], time.time())
                await self.pair.failover()
                record.target += f", {self.pair.primary.name} promoted"
                await asyncio.sleep(KINDS[kind])
                await self.pair.rejoin()
            self._later(record, fail_over_then_rejoin, wait=False)
        elif kind.startswith("network"):
            record = await self._network(kind, rng, at)
        elif kind == "postgresql restart":
            await self.pair.restart_immediate(self.pair.primary)
            record = FaultRecord(kind, self.pair.primary.name, at,
                                 time.monotonic() - self._started - at)
        else:
            raise ValueError(f"unknown fault {kind!r}")
        return record

    async def _network(self, kind: str, rng: random.Random, at: float) -> FaultRecord:
        network = self.network
        if network is None:
            raise RuntimeError("no network namespace on this machine")
        if kind == "network slow":
            await network.slow(SLOW_KBIT)
            target = f"{SLOW_KBIT} kbit/s both ways"
        elif kind == "network lossy":
            await network.loss(LOSS_PERCENT)
            target = f"{LOSS_PERCENT} % of the packets lost both ways"
        elif kind == "network one-way cut":
            requests = rng.random() < 0.5
            await network.cut(to_servers=requests, from_servers=not requests)
            target = ("the consumers' packets to every server dropped" if requests
                      else "every server's replies to the consumers dropped")
        else:  # cut from the broker
            await network.cut(True, True, [n.amqp_port for n in self.cluster.nodes])
            target = "the consumers and the broker's nodes cut both ways"
        record = FaultRecord(kind, target, at)
        self._later(record, network.heal)
        return record

    async def _rejoin(self) -> None:
        await self.pair.rejoin()

    def _later(self, record: FaultRecord, undo: Callable[[], Awaitable[None]],
               wait: bool = True) -> None:
        """Run `undo` `KINDS[kind]` seconds from now (`wait`; else `undo` waits itself), then
        record how long the fault lasted."""
        async def undo_after() -> None:
            if wait:
                await asyncio.sleep(KINDS[record.kind])
            await undo()
            record.lasted_s = time.monotonic() - self._started - record.at_s
        self._undoing.append((record.kind.split()[0], asyncio.create_task(undo_after())))

    async def _ask(self, *args: str, timeout_s: float = 20.0) -> str:
        """`rabbitmqctl <args>` on the first running node that answers, all tries within
        `timeout_s` seconds; its output. Raises RuntimeError when none does in time."""
        deadline = time.monotonic() + timeout_s
        failure: RuntimeError | None = None
        for node in self.cluster.nodes:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if node.running and not node.paused:
                try:
                    return await self.cluster.ctl(node, *args, timeout_s=left)
                except RuntimeError as exc:
                    failure = exc
        raise failure or RuntimeError("no running node answered in time")

    async def messages(self, queues: list[str], timeout_s: float = 5.0
                       ) -> dict[str, tuple[int, int]]:
        """The messages of each of `queues` that holds any, as the cluster counts them: name
        -> (ready, delivered and not yet acked) (`rabbitmqctl list_queues` on a running
        node; a queue that does not exist or is empty is left out). Raises RuntimeError
        when no node answers within `timeout_s` seconds: a queue without a leader can keep
        `list_queues` waiting, and the campaign's loop that asks also restarts crashed
        processes (a callee down a minute while it waited dead-lettered retries: seed 45
        run 60)."""
        out = await self._ask("list_queues", "name", "messages_ready",
                              "messages_unacknowledged", "--no-table-headers",
                              timeout_s=timeout_s)
        wanted, held = set(queues), {}
        for line in out.splitlines():
            name, *counts = line.split("\t")
            if name in wanted and len(counts) == 2 and all(c.strip().isdigit() for c in counts):
                ready, unacked = (int(c) for c in counts)
                if ready or unacked:
                    held[name] = (ready, unacked)
        return held

    async def close_all_connections(self, reason: str = "chaos: broker-side close") -> None:
        """The cluster closes every connection of its default virtual host, the campaign's
        (CONNECTION_FORCED), asked of a running node. Raises RuntimeError when none
        answers."""
        await self._ask("close_all_connections", "--vhost", "/", "--limit", "1000", reason)

    def keep_server_logs(self, into: Path) -> None:
        """Copy the cluster's node logs and the pair's server logs into `into` (a violating
        run's kept logs: what the servers did, e.g. a queue that could not forward its dead
        letters, is gone with them at the campaign's end)."""
        for node in self.cluster.nodes:
            with contextlib.suppress(OSError):
                shutil.copytree(node.directory / "log", into / node.name, dirs_exist_ok=True)
        for server in self.pair.servers:
            with contextlib.suppress(OSError):
                (into / server.name).mkdir(parents=True, exist_ok=True)
                shutil.copy2(server.directory / "server.log", into / server.name)

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
        if self.pair.primary.postmaster_pid() is None:  # a lagging failover's undoing failed
            await self.pair.failover()
        if self.pair.standby.postmaster_pid() is None:
            await self.pair.rejoin()
        if self.network is not None:
            await self.network.heal()
        for record in self.records:
            if record.lasted_s is None:
                record.lasted_s = time.monotonic() - self._started - record.at_s
