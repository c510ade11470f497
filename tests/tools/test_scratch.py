"""The stores a tool run makes for itself (tools/scratch.py): a database of a fresh name
and a virtual host, removed at the end; on a broker this host cannot administer, the URL's own
virtual host only when it holds none of the run's queues (issue 24)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from adapters.postgres.admin import database_name, drop_database
from adapters.rabbitmq import topology
from adapters.rabbitmq.connection import RabbitConnection
from entrypoints.settings import SettingsError
from tests.support.processes import this_run
from tests.support.services import Services, discover
from tests.support.users_stores import (
    MARKER,
    databases_like,
    queued,
    untouched_database,
    users_database,
    users_vhost,
    vhosts,
)
from tools import scratch
from tools.scratch import fresh_name, own_database, own_vhost

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

DELAYS = (0.1, 1.0)


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    found = discover()
    yield found
    found.close()


def test_a_fresh_name_is_the_prefix_the_pid_and_random_digits() -> None:
    first, second = fresh_name("eo_demo"), fresh_name("eo_demo")
    assert first.startswith(f"eo_demo_{os.getpid()}_")
    assert first != second
    assert fresh_name("eo-demo", "-").startswith(f"eo-demo-{os.getpid()}-")
    assert len(fresh_name("x" * 80)) <= 63  # PostgreSQL's longest name


async def test_own_database_is_new_and_dropped_and_the_named_one_untouched(
    services: Services
) -> None:
    name = this_run("eo_scratch_user")
    async with users_database(services.postgres_dsn, name) as dsn:
        async with own_database(dsn, name) as own:
            assert database_name(own).startswith(f"{name}_{os.getpid()}_")
            assert await databases_like(dsn, name) == [database_name(own)]
        assert await databases_like(dsn, name) == []
        with pytest.raises(RuntimeError, match="the block failed"):
            async with own_database(dsn, name):
                raise RuntimeError("the block failed")
        assert await databases_like(dsn, name) == []  # dropped on the way out too
        async with own_database(dsn, name, keep=True) as kept:
            pass
        assert await databases_like(dsn, name) == [database_name(kept)]
        async with own_database(dsn, database_name(kept)):  # a new one beside the kept one
            pass
        assert await untouched_database(dsn) == (["user_marker"], [MARKER])
    await drop_database(kept)


async def test_own_vhost_is_made_for_the_run_and_deleted(services: Services) -> None:
    async with users_vhost(services.amqp_url, this_run("eo-scratch-user", "-"),
                           "orders") as url:
        async with own_vhost(url, "eo-scratch", ["orders"], DELAYS, "eo test") as broker:
            assert broker.vhost is not None
            assert broker.vhost.startswith(f"eo-scratch-{os.getpid()}-")
            assert broker.vhost in vhosts()
            assert await queued(broker.url, "orders") is None  # a new, empty one
        assert broker.vhost not in vhosts()
        assert await queued(url, "orders") == 1


async def test_a_run_cancelled_while_its_virtual_host_is_made_deletes_it(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM arriving while rabbitmqctl makes the run's virtual host (seen: `eo bench`
    stopped then left it): the thread goes on and makes it, so the cancelled run waits for
    it and deletes it. The making is held until the cancellation has been delivered."""
    import asyncio
    import threading

    cancelled, made = threading.Event(), []
    real = scratch.on_own_vhost

    def held(url: str, vhost: str) -> str:
        cancelled.wait(30)  # made only once the run was cancelled
        made.append(vhost)
        return real(url, vhost)

    monkeypatch.setattr(scratch, "on_own_vhost", held)

    async def run() -> None:
        async with own_vhost(services.amqp_url, "eo-scratch", ["orders"], DELAYS, "eo test"):
            pytest.fail("the block ran")

    task = asyncio.create_task(run())
    await asyncio.sleep(0.2)  # in the thread, waiting
    task.cancel()
    await asyncio.sleep(0)
    cancelled.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(made) == 1
    assert made[0] not in vhosts()


async def test_without_rabbitmqctl_a_virtual_host_holding_the_runs_queues_is_refused(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A remote broker: no virtual host can be made, and the URL's holds `orders`, which
    the run would declare, consume and delete: refused before anything is touched."""
    monkeypatch.setattr(scratch, "controllable", lambda _url: False)
    async with users_vhost(services.amqp_url, this_run("eo-scratch-user", "-"),
                           "orders") as url:
        with pytest.raises(SettingsError) as caught:
            async with own_vhost(url, "eo-scratch", ["gateway", "orders"], DELAYS,
                                 "eo test"):
                pytest.fail("the block ran")
        message = str(caught.value)
        assert message.startswith("invalid setting EO_AMQP_URL: `eo test` cannot make")
        assert "holds orders already" in message
        assert "guest" not in message  # the URL is not shown
        assert await queued(url, "orders") == 1


async def test_without_rabbitmqctl_the_runs_queues_go_on_the_urls_virtual_host_and_only_they(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(scratch, "controllable", lambda _url: False)
    async with users_vhost(services.amqp_url, this_run("eo-scratch-user", "-"),
                           "users-queue") as url:
        async with own_vhost(url, "eo-scratch", ["orders"], DELAYS, "eo test") as broker:
            assert (broker.url, broker.vhost) == (url, None)
            rabbit = RabbitConnection(url)
            await rabbit.start()
            try:
                await topology.declare(rabbit, "orders", DELAYS, delivery_limit=5)
            finally:
                await rabbit.close()
        assert await queued(url, "orders") is None
        assert await queued(url, "orders.dlq") is None
        assert await queued(url, "users-queue") == 1
