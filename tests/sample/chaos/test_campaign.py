"""CI's short `eo chaos` campaign on the sample: the command itself (the engine on the TPC-H
workload, tools/tpch/chaos.py), against the local PostgreSQL and RabbitMQ (the campaign makes
a virtual host of its own and deletes it), one moto server and real processes: the fence
scenarios of every endpoint the draw gives a pair, then one random run. It must end with
every order settled, the oracle and the invariants holding, faults really injected, and the
fences staged; the mutation suite's `fence-campaign-on-the-sample-*` remove each half of
finish's fence and this test must report it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adapters.postgres.admin import with_database
from entrypoints.cli import app
from entrypoints.service_spec import resolve_service
from entrypoints.settings import load_settings
from service.registry import REGISTRY
from tests.support.processes import this_run
from tests.support.services import discover
from tools.chaos.plan import plan_run, topology_of
from tools.tpch.chaos import TpchWorkload
from tools.tpch.data import generate

pytestmark = pytest.mark.slow(minutes=2)  # real processes

ORDERS_PER_RUN = 8


def _seed_with_a_kill_and_a_crash() -> int:
    """A campaign seed whose first run kills a process and arms a crash failpoint, so the
    short CI campaign always exercises both (the plan is a function of the seed)."""
    layout = topology_of(resolve_service(load_settings(), REGISTRY))
    for seed in range(1000):
        plan = plan_run(seed, 0, layout, ORDERS_PER_RUN)
        if plan.kills and any("=crash" in spec for spec in plan.failpoints.values()):
            return seed
    raise AssertionError("no seed below 1000 plans both faults")


def test_a_short_campaign_injects_faults_and_finds_no_violation(tmp_path: Path) -> None:
    services = discover()
    try:
        amqp = services.amqp_url
        server = with_database(services.postgres_dsn, "postgres")
        seed = _seed_with_a_kill_and_a_crash()
        report = tmp_path / "report.json"
        result = CliRunner().invoke(app, [
            "chaos", "--duration", "900", "--runs", "1", "--seed", str(seed), "--size",
            str(ORDERS_PER_RUN), "--log-dir", str(tmp_path / "logs"),
            "--report", str(report), "--database", this_run("eo_chaos_ci")],
            env={"EO_AMQP_URL": amqp, "EO_DATABASE_DSN": server, "EO_FAILPOINTS": ""})
    finally:
        services.close()
    data = json.loads(report.read_text()) if report.exists() else {}
    assert data.get("violations") == [], result.output[-6000:]
    assert result.exit_code == 0, result.output
    *fenced, run = data["per_run"]
    # the boundary and the orders get their fences whatever the draw (each order's
    # commands share its partition); the ledger when two orders share a customer
    assert {r["scenario"] for r in fenced} >= {
        f"fence ({half}) on {endpoint}" for half in ("attempt guard", "compare-and-clear")
        for endpoint in ("gateway", "orders")}, data["fence_skipped"]
    assert set(data["fence_skipped"]) <= {"ledger"}
    assert data["fence_not_run"] == []
    for scenario in fenced:
        assert scenario["commits"] == scenario["expected_commits"] > 0
        assert scenario["faults"]["process exit (crash failpoint)"] == 2
    assert data["runs"] == len(fenced) + 1
    assert run["domain_checked"] is True  # the oracle on the run's orders
    assert run["commits"] == run["expected_commits"] > 0
    assert run["dead_letters"] == 0
    assert run["blobs"] == ORDERS_PER_RUN  # an invoice per order
    assert data["faults"]["kill -9"] >= 1
    assert data["faults"]["duplicate (published twice)"] >= 1
    # replayable from the seed: run 0's draw is the plan's, its messages the orders' commands
    plan = plan_run(seed, 0, topology_of(resolve_service(load_settings(), REGISTRY)),
                    ORDERS_PER_RUN)
    assert run["workload_seed"] == plan.workload_seed
    drawn = TpchWorkload(generate(0.001)).draw(random.Random(plan.workload_seed),
                                               ORDERS_PER_RUN)
    assert run["messages"] == len(drawn)
