"""Broker outages with real processes (issue 15): a lost broker connection must never stall a
consumer.

- The broker closes every connection of the run's virtual host, three times, under load.
- A work queue is deleted and re-declared under its two consumers (the broker cancels them):
  before consumption was supervised by the project, both orders processes kept their
  prefetched deliveries unacked and processed nothing, while the broker listed them as
  consumers (the aio-pika class of failures of issues #231, #563, #577, #668).
- The `drop_conn` failpoint at every point of an orders process where it can fire.
- An outage (the virtual host's permissions revoked): `/ready` says "not consuming" during it
  and "ready" after; when it outlasts `EO_BROKER_GIVE_UP_S` the process exits with status 69.

After each, every endpoint consumes again within `CONSUMING_AGAIN_S` (the queues' consumer
counts, as the broker reports them) and `Run.verify` checks the oracle and the invariants.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import aio_pika
import pytest

from adapters.rabbitmq import topology
from entrypoints.service_spec import resolve_service
from entrypoints.settings import load_settings
from tests.sample.chaos.cluster import RETRY_DELAYS, Run, log_events, pick_orders
from tools.chaos.plan import topology_of

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

ORDERS = pick_orders(12, seed=11)
TWO_ORDERS = pick_orders(2, seed=3)
#: every endpoint consumes again within this many seconds after an outage ends
CONSUMING_AGAIN_S = 20.0
ALL = {"gateway": 1, "orders": 1, "ledger": 1}
#: the exit status of a consumer whose broker stayed away (entrypoints.service)
BROKER_UNAVAILABLE_EXIT = 69


def rabbitmqctl(*args: str) -> str:
    return subprocess.run(["rabbitmqctl", "-q", *args], capture_output=True, text=True,
                          timeout=60, check=True).stdout


def vhost_of(url: str) -> str:
    return urlsplit(url).path.lstrip("/") or "/"


async def close_all_connections(chaos: Run) -> None:
    """The broker closes every connection of the run's virtual host (ours too)."""
    await asyncio.to_thread(rabbitmqctl, "close_all_connections", "--vhost",
                            vhost_of(chaos.settings.amqp()), "--limit", "1000",
                            "chaos: broker-side close")


@contextmanager
def access_revoked(chaos: Run) -> Iterator[None]:
    """An outage of the run's virtual host: the user may not connect to it (every
    connection closed, reconnections refused) until the block ends."""
    vhost = vhost_of(chaos.settings.amqp())
    user = urlsplit(chaos.settings.amqp()).username or "guest"
    rabbitmqctl("clear_permissions", "-p", vhost, user)
    try:
        rabbitmqctl("close_all_connections", "--vhost", vhost, "--limit", "1000", "outage")
        yield
    finally:
        rabbitmqctl("set_permissions", "-p", vhost, user, ".*", ".*", ".*")


async def consumer_counts(url: str, queues: list[str]) -> dict[str, int]:
    """The broker's consumer count of each queue (a fresh connection: the test's own may be
    among those the broker closes)."""
    connection = await aio_pika.connect(url)
    try:
        counts = {}
        for name in queues:
            channel = await connection.channel()
            queue = await channel.declare_queue(name, passive=True)
            counts[name] = queue.declaration_result.consumer_count or 0
            await channel.close()
        return counts
    finally:
        await connection.close()


async def consuming_again(chaos: Run, expected: dict[str, int],
                          within_s: float = CONSUMING_AGAIN_S) -> float:
    """Seconds until every queue has `expected` consumers; fails after `within_s`."""
    started = time.monotonic()
    url = chaos.settings.amqp()
    counts: dict[str, int] = {}
    while True:
        try:
            counts = await consumer_counts(url, list(expected))
        except (aio_pika.exceptions.AMQPError, OSError):
            counts = {}
        if counts == expected:
            return time.monotonic() - started
        if time.monotonic() - started > within_s:
            pytest.fail(f"consumers {counts}, expected {expected} after {within_s} s"
                        f"\n{chaos.cluster.tails()}")
        await asyncio.sleep(0.2)


def restarts(chaos: Run, name: str) -> list[dict[str, object]]:
    return [e for line in chaos.lines(name) if line.startswith("{")
            for e in [json.loads(line)] if e.get("event") == "consumer.restarted"]


async def test_broker_closes_every_connection_three_times_under_load(chaos: Run) -> None:
    """Row: a broker restart or network blip under load, three times in a row. Left:
    deliveries of the closed channels requeued, settlements that failed, maybe committed
    transactions not finished. Repaired by the processes' own reconnection and re-created
    consumers, redelivery and the sweeper. Asserted: every endpoint consumes again within the
    bound after the last close; each orders process re-created its consumer; the oracle and
    the invariants at rest."""
    await chaos.seed(ORDERS)
    await chaos.start_many(("orders-a", "orders", ""), ("orders-b", "orders", ""))
    await chaos.publish(ORDERS.commands)
    for _ in range(3):
        await asyncio.sleep(1.0)
        await close_all_connections(chaos)
    took = await consuming_again(chaos, {**ALL, "orders": 2})
    await chaos.verify()
    for name in ("orders-a", "orders-b"):
        assert restarts(chaos, name), f"{name} never re-created its consumer"
    print(f"consuming again {took:.1f} s after the last close")


async def test_work_queue_deleted_and_redeclared_under_its_consumers(chaos: Run) -> None:
    """The broker cancels both orders consumers (their queue is deleted), then the queue is
    declared again. Asserted: both processes consume the new queue within the bound (the
    reason logged: "cancelled"), and orders published afterwards settle (oracle)."""
    await chaos.seed(ORDERS)
    await chaos.start_many(("orders-a", "orders", ""), ("orders-b", "orders", ""))
    await consuming_again(chaos, {"orders": 2})
    assert chaos.rabbit is not None
    channel = chaos.rabbit.channel
    await channel.queue_delete("orders")
    await asyncio.sleep(0.5)
    await topology.declare(chaos.rabbit, "orders", RETRY_DELAYS,
                           chaos.settings.rabbitmq.delivery_limit)
    await consuming_again(chaos, {**ALL, "orders": 2})
    await chaos.publish(ORDERS.commands)
    await chaos.verify()
    for name in ("orders-a", "orders-b"):
        assert {e["reason"] for e in restarts(chaos, name)} == {"cancelled"}, name


#: The points an orders process reaches (co-located tokens, the campaign's topology).
ORDERS_POINTS = topology_of(resolve_service(load_settings())).points["orders"]


@pytest.mark.parametrize("point", ORDERS_POINTS)
async def test_drop_conn_at_every_point_of_a_consumer(chaos: Run, point: str) -> None:
    """`<point>=drop_conn@1` in the only orders process: the connection closes there, in the
    middle of processing. Asserted: the failpoint fired; the process re-created its consumer
    and every endpoint consumes again; nobody exited; the oracle and the invariants."""
    await chaos.seed(TWO_ORDERS)
    await chaos.start("orders-a", "orders", f"{point}=drop_conn@1")
    await chaos.publish(TWO_ORDERS.commands)
    result = await chaos.verify()
    fired = [e for e in result.events("fault.injected") if e.get("failpoint") == point]
    assert fired, f"{point} never fired"
    await consuming_again(chaos, ALL)
    assert restarts(chaos, "orders-a"), "the consumer was not re-created"
    assert result.exits == []


async def test_ready_is_false_during_an_outage_and_true_after(chaos: Run) -> None:
    """The broker refuses the run's user for a few seconds (permissions revoked, connections
    closed). Asserted: `/ready` answers 503 with `consuming` and `publishing` false during the
    outage, 200 after it; the restart is counted in `eo_consumer_restarts_total`; the oracle
    holds for orders published during the outage."""
    await chaos.seed(TWO_ORDERS)
    # unset: the process binds the first free port from 9464 and logs it (no port is chosen
    # here, so a service left running on this machine cannot take it first)
    await chaos.start("orders-a", "orders", "", {"EO_METRICS_PORT": None})
    [status_url] = [e["status_url"] for e in log_events(chaos.cluster.log_of("orders-a"))
                    if e.get("event") == "consumer.started"]

    def get(path: str) -> tuple[int, str]:
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(f"{status_url}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    assert (await asyncio.to_thread(get, "/ready"))[0] == 200
    with access_revoked(chaos):
        deadline = time.monotonic() + 10
        while True:
            status, body = await asyncio.to_thread(get, "/ready")
            if status == 503:
                break
            assert time.monotonic() < deadline, "still ready during the outage"
            await asyncio.sleep(0.1)
        checks = json.loads(body)
        assert checks["consuming"] is False, checks
        assert checks["publishing"] is False, checks
        await asyncio.sleep(2.0)
        assert (await asyncio.to_thread(get, "/ready"))[0] == 503
    await consuming_again(chaos, ALL)
    assert (await asyncio.to_thread(get, "/ready"))[0] == 200
    _, metrics = await asyncio.to_thread(get, "/metrics")
    assert 'eo_consumer_restarts_total{endpoint="orders",reason="channel_closed"} 1.0' in metrics
    await chaos.publish(TWO_ORDERS.commands)
    await chaos.verify()


async def test_an_outage_longer_than_the_give_up_time_ends_the_process_with_status_69(
        chaos: Run) -> None:
    """The broker stays away longer than `EO_BROKER_GIVE_UP_S` (3 s here). Asserted: the
    orders process exits with status 69 (EX_UNAVAILABLE: the orchestrator restarts it),
    logging `consumer.broker_unavailable`; started again after the outage, it consumes and
    the orders settle."""
    await chaos.seed(TWO_ORDERS)
    await chaos.start("orders-a", "orders", "", {"EO_BROKER_GIVE_UP_S": "3"})
    with access_revoked(chaos):
        deadline = time.monotonic() + 30
        while chaos.cluster.alive("orders-a"):
            assert time.monotonic() < deadline, "orders-a still runs after the give-up time"
            await asyncio.sleep(0.2)
    proc = chaos.cluster.fleet.procs["orders-a"]
    assert proc.poll() == BROKER_UNAVAILABLE_EXIT
    events = [e.get("event") for e in log_events(chaos.cluster.log_of("orders-a"))]
    assert "consumer.broker_unavailable" in events
    await chaos.start("orders-a", "orders")  # what the orchestrator does
    await chaos.publish(TWO_ORDERS.commands)
    await chaos.verify()
