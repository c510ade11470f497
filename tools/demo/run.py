"""`eo demo` on the embedded profile: TPC-H through the gateway, duplicates, the oracle."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from adapters.memory.broker import MemoryBroker
from adapters.memory.source import MemorySource
from adapters.system.clock import OffsetClock
from application.codec import encode
from application.consumer_process import ConsumerProcess
from application.envelope import Envelope
from application.observability import HANDLER_INVOKED, TRANSACTION_CONFLICT
from application.workers import Workers
from domain.sample.payments import open_account
from entrypoints.settings import Settings
from tools.tpch.data import TpchSample
from tools.tpch.oracle import OracleResult, check_oracle, sandbox_executions

#: The sample's boundary endpoint (the commands' queue) and its HTTP callee.
GATEWAY, PAYMENTS = "gateway", "payments"


class DuplicatingDispatcher:
    """Dispatches through the broker and re-publishes a share (`rate`) of messages with the
    same message ID: half at once (a concurrent copy for another consumer), half after up to
    `late_s` seconds (usually after the original was consumed: its token is gone)."""

    def __init__(self, broker: MemoryBroker, rate: float, rng: random.Random,
                 late_s: float = 0.5) -> None:
        self.broker, self.rate, self.rng, self.late_s = broker, rate, rng, late_s
        self.injected = 0

    async def dispatch(self, destination: str, envelope: Envelope) -> None:
        await self.broker.dispatch(destination, envelope)
        self.duplicate(destination, envelope)

    def duplicate(self, destination: str, envelope: Envelope) -> None:
        """Maybe publish a copy of `envelope` now or later."""
        draw = self.rng.random()
        if draw < self.rate / 2:
            self.broker.publish(destination, envelope)
        elif draw < self.rate:
            self.broker.publish_later(destination, envelope, self.rng.uniform(0, self.late_s))
        else:
            return
        self.injected += 1


@dataclass
class DemoReport:
    """What `eo demo` prints: traffic, protocol counts, outcomes, leftovers, the oracle."""

    orders: int
    settlements: Counter[str]
    duplicates_injected: int
    conflicts: int
    handler_runs: int
    oracle: OracleResult
    leftovers: dict[str, int]
    dead_letters: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def deliveries(self) -> int:
        return sum(self.settlements.values())

    @property
    def ok(self) -> bool:
        return (not self.oracle.violations and not any(self.leftovers.values())
                and self.dead_letters == 0)


async def run_demo(
    system: Workers,
    sample: TpchSample,
    duplicates: DuplicatingDispatcher,
    consumers: int,
    rng: random.Random,
    credit_limit: Decimal,
    settings: Settings,
    on_progress: Callable[[int], None] = lambda _done: None,
    timeout_s: float = 600.0,
    inbox_feed: Sequence[Envelope] | None = None,
) -> DemoReport:
    """Feed every command through the gateway, run `consumers` competing consumers per
    endpoint until quiescence, sweep, and check the oracle (payments accounts open with
    TPC-H `c_acctbal` plus `credit_limit`). Raises TimeoutError when the
    system does not quiesce within `timeout_s`.

    With `inbox_feed` (the commands as the Spark ingest derived them) nothing is published
    by the producer: the commands are added to the gateway's inbox twice (a re-run producer:
    the second add finds every natural ID there) and an in-process relay publishes them,
    through `duplicates` (which re-publishes a share, as a relay that crashed would).
    `settings`: the grace periods the final sweep skips (the consumers' prefetch is
    `system`'s)."""
    started = time.monotonic()
    broker = duplicates.broker
    for customer, balance in sample.customers:
        system.stores[PAYMENTS].seed_state(  # type: ignore[attr-defined]
            str(customer), open_account(customer, balance, credit_limit))
    workers: list[ConsumerProcess] = []
    tasks = []
    notes: list[str] = []
    if inbox_feed is None:
        commands = list(sample.commands)
        rng.shuffle(commands)  # the producer's order is not the business order
        for command in commands:
            envelope = Envelope(command.message_id, type(command.message).__name__,
                                encode(command.message), MappingProxyType({}))
            broker.publish(GATEWAY, envelope)
            duplicates.duplicate(GATEWAY, envelope)  # the producer re-sends some commands
    else:
        feed = list(inbox_feed)
        rng.shuffle(feed)
        inbox = system.inboxes[GATEWAY]
        first, again = await inbox.add(feed), await inbox.add(feed)
        notes.append(f"spark ingest: {len(feed):,} commands derived, {first:,} new in the "
                     f"gateway's inbox, {again:,} new when added again (re-run)")
        tasks.append(asyncio.create_task(system.relay(GATEWAY).run(0.05)))
    for name in system.registry.consuming():
        for i in range(consumers):
            process = system.consumer_process(name, MemorySource(broker, name, f"{name}-{i}"))
            workers.append(process)
            tasks.append(asyncio.create_task(process.run()))
    idle_polls = 0
    while idle_polls < 4:
        await asyncio.sleep(0.05)
        relayed = await system.inboxes[GATEWAY].count_pending() == 0
        idle_polls = idle_polls + 1 if broker.idle() and relayed else 0
        ledger: Any = system.stores["ledger"]
        on_progress(sum(len(s.confirmed) + len(s.rejected) for s in ledger.states().values()))
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"no quiescence after {timeout_s} s")
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    later = OffsetClock(system.clock, timedelta(seconds=settings.protocol.cleanup_grace_s
                                                + settings.protocol.stale_after_s + 1))
    for name in system.registry.names():
        await system.sweeper(name, later).sweep()
    report = await _report(system, sample, duplicates, workers, time.monotonic() - started,
                           credit_limit)
    report.notes.extend(notes)
    return report


async def _report(system: Workers, sample: TpchSample, duplicates: DuplicatingDispatcher,
                  workers: list[ConsumerProcess], seconds: float, credit_limit: Decimal
                  ) -> DemoReport:
    stores: Any = system.stores
    blob_keys = await system.blobs.keys() if system.blobs is not None else []
    oracle = check_oracle(sample, stores["orders"].states(), stores["ledger"].states(),
                          stores[PAYMENTS].states(), blob_keys, credit_limit,
                          sandbox_executions(system.apis))
    leftovers = {
        "tokens": await system.tokens.count(),
        "unfinished transaction records": sum([await s.unfinished_count()
                                               for s in stores.values()]),
        "side-effect records": sum(s.record_count() for s in stores.values()),
        "aborted artifacts (deferred clean-ups)": sum([await s.cleanup_count()
                                                       for s in stores.values()]),
        "requests on payments": await system.requests[PAYMENTS].count(),
        "unrelayed inbox rows": await system.inboxes[GATEWAY].count_pending(),
    }
    settlements: Counter[str] = Counter()
    for worker in workers:
        settlements.update({str(k): v for k, v in worker.settled().items()})
    events = system.events
    return DemoReport(
        orders=len(sample.expected), settlements=settlements,
        duplicates_injected=duplicates.injected,
        conflicts=events.total(TRANSACTION_CONFLICT),  # type: ignore[attr-defined]
        handler_runs=events.total(HANDLER_INVOKED),  # type: ignore[attr-defined]
        oracle=oracle, leftovers=leftovers,
        dead_letters=sum(len(v) for v in duplicates.broker.dead_letters.values()),
        seconds=seconds)

