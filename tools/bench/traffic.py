"""Both ends of an `eo bench` run (tools/bench/run.py): the producer that publishes deposits
to the work queue, and the sink that receives the outputs, with their latency and the
process groups' CPU (`GROUPS`) at the first and the last."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass, field
from types import MappingProxyType

import psutil
from aio_pika.abc import AbstractIncomingMessage

from adapters.postgres.token_store import PostgresTokenStore
from adapters.rabbitmq.connection import RabbitConnection
from adapters.rabbitmq.dispatcher import envelope_message
from application.codec import encode
from application.envelope import TOKEN_HEADER, Envelope
from tools.bench import endpoint as bench
from tools.bench.report import Params
from tools.bench.shapes import Shape, account_picker

#: process-group name -> the process names (psutil) whose CPU it sums
GROUPS = {"postgresql": ("postgres",), "rabbitmq": ("beam.smp", "erl_child_setup")}


def group_cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) used so far by each of `GROUPS`' processes, summed."""
    totals = dict.fromkeys(GROUPS, 0.0)
    for proc in psutil.process_iter(["name", "cpu_times"]):
        times = proc.info["cpu_times"]
        if times is None:
            continue
        for group, names in GROUPS.items():
            if proc.info["name"] in names:
                totals[group] += times.user + times.system
    return totals


class Sink:
    """Consumes a run's sink queue: receipt times of distinct outputs (keyed by the
    producer's `sent_at_ns`), their latency, and the process groups' CPU at the first and
    at the expected output."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.duplicates = 0
        self._expect(0)

    def _expect(self, count: int) -> None:
        self.target, self.done = len(self.seen) + count, asyncio.Event()
        self.first_ns = self.last_ns = 0
        self.cpu_first: dict[str, float] = {}
        self.cpu_last: dict[str, float] = {}
        self.latencies_ns: list[int] = []

    def expect(self, count: int) -> None:
        """Wait for `count` more distinct outputs (`done` is set at the last)."""
        self._expect(count)

    async def start(self, connection: RabbitConnection, queue: str) -> None:
        """Consume `queue` (declared already) on a channel of `connection`'s own."""
        self._channel = await connection.open_channel(prefetch=1000)
        self._queue = await self._channel.declare_queue(queue, passive=True)
        self._tag = await self._queue.consume(self._on_message)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        now = time.monotonic_ns()
        await message.ack()
        sent = int(json.loads(message.body)["sent_at_ns"])  # unique per incoming message
        if sent in self.seen:
            self.duplicates += 1
            return
        self.seen.add(sent)
        self.latencies_ns.append(now - sent)
        if not self.first_ns:
            self.first_ns, self.cpu_first = now, group_cpu_s()
        if len(self.seen) == self.target:
            self.last_ns, self.cpu_last = now, group_cpu_s()
            self.done.set()

    async def stop(self) -> None:
        """Stop consuming and close the channel."""
        await self._queue.cancel(self._tag)
        await self._channel.close()


@dataclass
class Producer:
    """Publishes deposits to a work queue (creating their tokens first on a token path),
    on the accounts `shape` draws; `sent_at_ns` is unique and strictly increasing, the
    output's key at the sink."""

    params: Params
    driver: RabbitConnection
    tokens: PostgresTokenStore
    work: str
    token: bool
    rng: random.Random
    shape: Shape = field(default_factory=Shape)
    last: int = 0
    #: how long each paced message's token insert took (ns): part of its latency
    inserts_ns: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._account = account_picker(self.shape, self.params.partitions, self.rng)

    def _next(self) -> Envelope:
        self.last = max(time.monotonic_ns(), self.last + 1)
        deposit = bench.Deposit(f"acct-{self._account()}", self.rng.randint(1, 10_000),
                                self.last)
        headers = MappingProxyType({TOKEN_HEADER: "1"} if self.token else {})
        return Envelope(uuid.uuid4(), "Deposit", encode(deposit), headers)

    async def _send(self, batch: list[Envelope], timed: bool = False) -> None:
        """Create the batch's tokens (a token path), then publish it; with `timed`, the
        token insert's duration goes to `inserts_ns` (the sender's part of the latency)."""
        if self.token:
            began = time.monotonic_ns()
            await self.tokens.create(self.work, batch)
            if timed:
                self.inserts_ns.append(time.monotonic_ns() - began)
        await asyncio.gather(*(self.driver.publish(self.work, envelope_message(e))
                               for e in batch))

    async def preload(self, count: int) -> list[uuid.UUID]:
        """Publish `count` deposits as fast as confirms allow; returns their IDs."""
        ids: list[uuid.UUID] = []
        for start in range(0, count, 200):
            batch = [self._next() for _ in range(min(200, count - start))]
            await self._send(batch)
            ids += [e.message_id for e in batch]
        return ids

    async def paced(self, count: int, rate_per_s: float) -> list[uuid.UUID]:
        """Publish `count` deposits at `rate_per_s`, each at its scheduled time."""
        loop, ids = asyncio.get_running_loop(), []
        start = loop.time()
        for i in range(count):
            await asyncio.sleep(max(0.0, start + i / rate_per_s - loop.time()))
            envelope = self._next()
            await self._send([envelope], timed=True)  # the sender's token insert timed apart
            ids.append(envelope.message_id)
        return ids
