"""`eo chaos` for any service (tools/chaos/engine.py) on the counters service: its processes
and failpoints derived from the registry, plans replayable from the seed, workloads refused by
name, and one run with real processes on PostgreSQL, RabbitMQ and moto that finds no
violation, says what it injected and leaves a user's database and virtual host alone."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from entrypoints.service_spec import resolve_service
from entrypoints.settings import load_settings
from tests.support.counters.registry import REGISTRY, SPEC
from tests.support.processes import this_run
from tests.support.services import discover
from tests.support.users_stores import (
    MARKER,
    databases_like,
    queued,
    untouched_database,
    users_database,
    users_vhost,
)
from tools.chaos.engine import ENGINE_DATABASE
from tools.chaos.plan import plan_run, topology_of
from tools.chaos.production import KINDS, unavailable
from tools.chaos.workload import WorkloadError, load_workload, read_messages
from tools.faults.network import available as network_available

ROOT = Path(__file__).resolve().parents[2]


def _layout(workers: int = 2):  # type: ignore[no-untyped-def]
    return topology_of(resolve_service(load_settings(), REGISTRY), workers)


def test_the_processes_and_failpoints_come_from_the_registry() -> None:
    layout = _layout()
    assert layout.processes == {"front-0": "front", "front-1": "front",
                                "counter-0": "counter", "counter-1": "counter",
                                "audit-0": "audit", "audit-1": "audit", "bank": "bank"}
    assert layout.queues == ("front", "counter", "audit")
    assert layout.callees == ("bank",)
    assert layout.points["bank"] == ("callee.after_commit", "callee.before_reply")
    # the counter writes receipts and calls the bank; the gateway and the audit do neither
    assert {"after_create:blob", "after_put", "after_create:http_request"} <= set(
        layout.points["counter"])
    assert not {"after_create:blob", "after_put"} & set(layout.points["front"])
    assert "after_state_load" not in layout.points["audit"]  # not on the state strategy


def test_a_plan_is_a_function_of_the_seed_and_the_run() -> None:
    layout = _layout()
    assert plan_run(7, 3, layout, 20) == plan_run(7, 3, layout, 20)
    plans = [plan_run(7, run, layout, 20) for run in range(8)]
    assert len({json.dumps(p.failpoints, sort_keys=True) for p in plans}) > 1
    for plan in plans:
        for process, rules in plan.failpoints.items():
            for rule in filter(None, rules.split(";")):
                point = rule.split("=")[0]
                assert point in layout.points[layout.processes[process]], (process, rule)
    # half the runs stall a finisher while its endpoint's other consumer goes on
    assert any("after_publish_all=sleep:1500" in r for p in plans for r in p.failpoints.values())


def _line(queue: str, message_id: str, type_: str, body: object) -> str:
    return json.dumps({"queue": queue, "message_id": message_id, "type": type_, "body": body})


def test_a_workload_that_cannot_be_used_is_named(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="give --messages FILE"):
        load_workload(None, None, None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(_line("front", str(uuid.uuid4()), "Add", {}) + "\n{\"queue\": \"front\"}\n")
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:2: no message_id, type"):
        read_messages(bad)
    with pytest.raises(WorkloadError, match="--workload 'nowhere:thing': cannot import"):
        load_workload(None, "nowhere:thing", None)
    with pytest.raises(WorkloadError, match="--check goes with --messages"):
        load_workload(None, "tools.chaos.workload:FileWorkload", "x:y")
    with pytest.raises(WorkloadError, match="--order-independent goes with --messages"):
        load_workload(None, "tools.chaos.workload:FileWorkload", None, order_independent=True)


def _workload(path: Path) -> int:
    """Adds to the gateway for five counters, one message with a bad ID (dead-lettered as
    the fault-free run dead-letters it) and one Spend (the bank callee); returns the count."""
    rng = random.Random(3)
    lines = [_line("front", str(uuid.UUID(int=rng.getrandbits(128))), "Add",
                   {"counter": f"c{rng.randrange(5)}", "amount": rng.randrange(1, 50)})
             for _ in range(30)]
    lines.append(_line("front", "not-a-uuid", "Add", {"counter": "c1", "amount": 1}))
    lines.append(_line("front", str(uuid.UUID(int=7)), "Spend", {"counter": "c1", "amount": 5}))
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


async def _beside_the_users_stores(tmp_path: Path, messages: Path, *options: str
                                   ) -> dict[str, Any]:
    """`eo chaos --messages <messages> <options>` on the counters service, with a user's
    database and virtual host named in EO_DATABASE_DSN and EO_AMQP_URL; its report, once
    the campaign exited 0, left the user's stores as they were and dropped its own
    database (named with its process ID)."""
    services = discover()
    try:
        async with users_database(services.postgres_dsn, this_run("eo_chaos_user")) as dsn, \
                users_vhost(services.amqp_url, this_run("eo-chaos-user", "-"), "front") as url:
            env = {k: v for k, v in os.environ.items() if not k.startswith("EO_")}
            env.update({"EO_SERVICE": SPEC, "EO_DATABASE_DSN": dsn, "EO_AMQP_URL": url,
                        "PYTHONPATH": str(ROOT)})
            report = tmp_path / "report.json"
            campaign = await asyncio.create_subprocess_exec(
                sys.executable, "-c", "from entrypoints.cli import main; main()", "chaos",
                "--messages", str(messages), *options, "--report", str(report),
                cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(campaign.communicate(), 400)
            assert campaign.returncode == 0, (out[-4000:] + err[-4000:]).decode(
                errors="replace")
            result: dict[str, Any] = json.loads(report.read_text())
            assert await untouched_database(dsn) == (["user_marker"], [MARKER])
            assert await queued(url, "front") == 1
        assert await databases_like(services.postgres_dsn,
                                    f"{ENGINE_DATABASE}_{campaign.pid}") == []
    finally:
        services.close()
    return result


@pytest.mark.slow  # a campaign of real processes
async def test_one_run_on_real_processes_finds_no_violation_and_leaves_the_users_stores_alone(
        tmp_path: Path) -> None:
    messages = tmp_path / "messages.jsonl"
    count = _workload(messages)
    result = await _beside_the_users_stores(tmp_path, messages, "--seed", "1", "--run", "0",
                                            "--log-dir", str(tmp_path / "logs"))
    assert result["violations"] == []
    [run] = result["per_run"]
    assert run["messages"] == count
    assert run["commits"] == run["expected_commits"] > count  # the gateway's and downstream
    assert run["dead_letters"] == 1  # "not-a-uuid", as in the fault-free run
    assert run["blobs"] > 0  # the counter's receipts, each named by a state
    assert result["faults"]["duplicate (published twice)"] > 0
    assert sum(n for kind, n in result["faults"].items()
               if kind.startswith(("failpoint", "kill", "broker"))) > 0


@pytest.mark.slow(minutes=3)  # a campaign of real processes, on a cluster and a pair of its own
@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
async def test_a_run_with_production_faults_finds_no_violation_on_servers_of_its_own(
        tmp_path: Path) -> None:
    """CI's short version of the production campaign: seed 61's first two runs draw a
    failover after a lagging standby and a kill of a queue's leader node, then a one-way
    network cut (without root or nftables, the network faults are left out)."""
    messages = tmp_path / "messages.jsonl"
    _workload(messages)
    # the machine's server and broker, the user's, were not the campaign's: nothing made
    result = await _beside_the_users_stores(tmp_path, messages, "--production", "--seed",
                                            "61", "--runs", "2", "--no-fence",
                                            "--duration", "600")
    assert result["violations"] == []
    runs = result["per_run"]
    assert len(runs) == 2
    assert all(run["commits"] == run["expected_commits"] for run in runs), runs
    lines = [line for run in runs for line in run["production"]]
    assert sum(result["faults"].get(kind, 0) for kind in KINDS) == len(lines) >= 2, lines
    # each fault named with its time and target, and what the services did in its window
    assert all(" received again; " in line for line in lines), lines
    [lagging] = [line for line in lines if "standby lagging" in line]
    # synchronous replication: no commit was acknowledged by the primary alone
    assert lagging.endswith("; 0 transactions committed while the standby lagged"), lagging
    if network_available() is None:
        assert any("network one-way cut" in line for line in lines), lines


@pytest.mark.slow  # a campaign of real processes
async def test_a_declared_workload_with_states_before_it_and_a_domain_check(
        tmp_path: Path) -> None:
    """`--workload`: the counters' generator, their bank accounts opened in the campaign's
    database before the messages (and in the reference's stores), and the domain's check
    (totals, debits, balances) on the final states."""
    services = discover()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EO_")}
    env.update({"EO_SERVICE": SPEC, "EO_DATABASE_DSN": services.postgres_dsn,
                "EO_AMQP_URL": services.amqp_url, "PYTHONPATH": str(ROOT)})
    report = tmp_path / "report.json"
    try:
        campaign = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from entrypoints.cli import main; main()", "chaos",
            "--workload", "tests.support.counters.chaos:WORKLOAD", "--size", "24", "--seed",
            "2", "--run", "1", "--report", str(report), cwd=tmp_path, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(campaign.communicate(), 400)
    finally:
        services.close()
    assert campaign.returncode == 0, (out[-4000:] + err[-4000:]).decode(errors="replace")
    result = json.loads(report.read_text())
    [run] = result["per_run"]
    assert result["violations"] == []
    assert run["messages"] == 24
    assert run["domain_checked"] is True
    assert run["commits"] == run["expected_commits"]


def test_the_counters_domain_check_names_a_wrong_total_and_a_wrong_account() -> None:
    from tests.support.counters.chaos import OPENING, WORKLOAD
    from tests.support.counters.endpoints import Account, Tally
    from tools.chaos.workload import RunOutcome

    messages = WORKLOAD.draw(random.Random(1), 12)
    added = {c: sum(json.loads(m.body)["amount"] for m in messages
                    if m.type == "Add" and json.loads(m.body)["counter"] == c)
             for c in ("c0", "c1", "c2", "c3", "c4")}
    right = {c: Tally(total=n) for c, n in added.items()}
    accounts = {c: Account(balance=OPENING) for c in added}
    states = {"counter": right, "bank": accounts}
    assert WORKLOAD.check(RunOutcome(states, [], {}, messages)) == []
    wrong = {**right, "c0": Tally(total=added["c0"] + 1)}  # an Add applied twice, say
    debited = {**accounts, "c1": Account(balance=OPENING - 5, debits=(5,))}  # spent nowhere
    problems = WORKLOAD.check(RunOutcome({"counter": wrong, "bank": debited}, [], {},
                                         messages))
    assert [p.split(":")[0] for p in problems] == ["c0", "c1"]


def test_orphaned_missing_and_extra_blobs_are_named() -> None:
    from tools.chaos.verdict import blob_findings

    kept, lost, stray = (f"labels/{uuid.uuid5(uuid.uuid4(), 'labels/0')}" for _ in range(3))
    named = json.dumps({"parcels": {"p-1": {"label": kept}, "p-2": {"label": lost}}})
    assert blob_findings([kept, lost], named, 2) == []
    assert blob_findings([kept, stray], named, 2) == [
        f"orphan: object {stray} is named by no state",
        f"missing: a state names object {lost}, which is not in the bucket"]
    assert blob_findings([kept], named, 2)[-1] == "blobs: 1 objects, the fault-free run wrote 2"
