"""The local demo and the chaos campaign touch only the database and virtual host they create
(issue 24: "without EO_PROFILE, `eo demo` empties the queues of any vhost other than `/` that
it is pointed at, and drops and re-creates `eo_demo`"). A user's database under the name the
tool uses, and a user's virtual host holding one of the sample's queues with a message in it,
survive a run, and the run leaves nothing of its own behind. A few orders each: fast."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adapters.postgres.admin import database_name, with_database
from entrypoints.cli import app
from entrypoints.service_spec import resolve_service
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
from tools.chaos.plan import plan_run, topology_of
from tools.demo import local
from tools.demo.local import demo_settings, run_local_demo
from tools.settings import load_tool_settings
from tools.tpch.data import generate

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively


@pytest.fixture(scope="module")
def services() -> Iterator[Services]:
    found = discover()
    yield found
    found.close()


def _runs_of_this_process(prefix: str) -> list[str]:
    """The virtual hosts a tool made in this process (`<prefix>-<pid>-<hex>`)."""
    return [v for v in vhosts() if v.startswith(f"{prefix}-{os.getpid()}-")]


async def test_the_local_demo_leaves_a_users_database_and_virtual_host_alone(
    services: Services, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = this_run("eo_demo_user")
    async with users_database(services.postgres_dsn, name) as dsn, \
            users_vhost(services.amqp_url, this_run("eo-demo-user", "-"), "orders") as url:
        monkeypatch.setattr(local, "DEMO_DATABASE", name)  # the name the demo once dropped
        base = load_tool_settings(profile="local", database_dsn=dsn, amqp_url=url)
        settings = demo_settings(base, tmp_path / "blobs")
        sample = generate(0.001)
        small = sample.subset(sorted(sample.expected)[:3])
        (tmp_path / "logs").mkdir()
        report = await run_local_demo(settings, resolve_service(settings), small, 2, 0.0, 1,
                                      tmp_path / "logs", timeout_s=180)
        assert (await untouched_database(dsn), await queued(url, "orders")) == (
            (["user_marker"], [MARKER]), 1)
        assert report.ok, (report.oracle.violations, report.leftovers, report.notes)
        assert await queued(url, "gateway") is None  # nothing declared there either
        assert await databases_like(dsn, name) == []  # the run's own is gone
        assert _runs_of_this_process("eo-demo") == []


def _gentle_seed(orders: int) -> int:
    """A campaign seed whose first run plans neither a kill, a crash, a long sleep nor a
    broker-side close: the run is quick (the faults are not what this test is about)."""
    layout = topology_of(resolve_service(load_tool_settings()))
    for seed in range(1000):
        plan = plan_run(seed, 0, layout, orders)
        rules = ";".join(plan.failpoints.values())
        if not (plan.kills or plan.broker_closes or "crash" in rules or "sleep:800" in rules
                or "sleep:1500" in rules):
            return seed
    raise AssertionError("no gentle seed below 1000")


async def test_the_chaos_campaign_leaves_a_users_database_and_virtual_host_alone(
    services: Services, tmp_path: Path
) -> None:
    name = this_run("eo_chaos_user")
    async with users_database(services.postgres_dsn, name) as dsn, \
            users_vhost(services.amqp_url, this_run("eo-chaos-user", "-"), "orders") as url:
        # the command runs its own event loop: in a thread of its own
        result = await asyncio.to_thread(CliRunner().invoke, app, [
            "chaos", "--duration", "0", "--seed", str(_gentle_seed(2)), "--size",
            "2", "--no-fence", "--database", name, "--report", str(tmp_path / "report.json")],
            env={"EO_AMQP_URL": url, "EO_DATABASE_DSN": with_database(dsn, "postgres"),
                 "EO_FAILPOINTS": ""})
        assert (await untouched_database(dsn), await queued(url, "orders")) == (
            (["user_marker"], [MARKER]), 1)
        assert result.exit_code == 0, result.output
        assert await databases_like(dsn, database_name(dsn)) == []
        assert _runs_of_this_process("eo-chaos") == []
