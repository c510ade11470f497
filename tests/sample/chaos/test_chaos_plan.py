"""The sample's campaign (the engine on tools/tpch/chaos.py's workload): its fault plans are
a pure function of (seed, run) with valid rules only where a process can reach them (the
callee's names only for the callee, blobs, HTTP and the carrier only for orders), bounded
faults; its workload draws replayable orders, opens every account, and its domain check is
the sample's oracle."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import pytest

from application.failpoints import parse
from entrypoints.service_spec import resolve_service
from entrypoints.settings import load_settings
from service.registry import REGISTRY
from tools.chaos.plan import CALLEE_POINTS, plan_run, topology_of
from tools.chaos.workload import RunOutcome
from tools.tpch.chaos import TpchWorkload
from tools.tpch.data import generate

LAYOUT = topology_of(resolve_service(load_settings(), REGISTRY))
WORKLOAD = TpchWorkload(generate(0.001))


def test_the_sample_runs_two_consumers_per_queue_and_its_callee() -> None:
    assert LAYOUT.processes == {"gateway-0": "gateway", "gateway-1": "gateway",
                                "orders-0": "orders", "orders-1": "orders",
                                "ledger-0": "ledger", "ledger-1": "ledger",
                                "payments": "payments"}
    assert LAYOUT.apis == ("carrier",)
    assert {"after_create:blob", "after_put", "after_api_call"} <= set(LAYOUT.points["orders"])
    for endpoint in ("gateway", "ledger"):  # neither writes blobs nor calls out
        assert not {"after_create:blob", "after_put", "after_api_call"} & set(
            LAYOUT.points[endpoint])


def test_the_same_seed_and_run_give_the_same_plan_and_others_differ() -> None:
    assert plan_run(1, 3, LAYOUT, 20) == plan_run(1, 3, LAYOUT, 20)
    plans = {repr(plan_run(seed, run, LAYOUT, 20)) for seed in (1, 2) for run in range(10)}
    assert len(plans) == 20


@pytest.mark.parametrize("seed", range(0, 400, 10))
def test_plans_hold_valid_bounded_faults(seed: int) -> None:
    plan = plan_run(seed, seed % 7, LAYOUT, 12, max_faults=4)
    rules = {name: parse(spec) for name, spec in plan.failpoints.items()}
    stalled = sum("after_publish_all=sleep:1500" in spec for spec in plan.failpoints.values())
    assert sum(len(r) for r in rules.values()) + len(plan.kills) <= 4 + stalled
    for process, parsed in rules.items():
        for name, rule in parsed.items():
            assert (name in CALLEE_POINTS) == (process == "payments")
            assert name in LAYOUT.points[LAYOUT.processes[process]]  # one it can reach
            if process == "payments":
                assert rule.action != "drop_conn"  # the callee has no broker connection
            # each rule fires at most twice: far below the attempt limit
            assert rule.mode == "@" or (rule.mode == "*" and rule.n <= 2)
    assert all(name in LAYOUT.processes and 0 <= at < 1 for at, name in plan.kills)
    assert 0 < plan.duplicate_rate < 1
    assert 0 <= plan.republish <= 5


def test_a_run_draws_whole_orders_replayably_and_opens_every_account() -> None:
    messages = WORKLOAD.draw(random.Random(5), 6)
    assert messages == WORKLOAD.draw(random.Random(5), 6)
    orders = WORKLOAD.orders(random.Random(5), 6)
    assert len(orders) == 6
    assert {m.queue for m in messages} == {"gateway"}
    assert len(messages) == len(WORKLOAD.sample.subset(orders).commands)
    accounts = WORKLOAD.seed_states(messages)["payments"]
    assert len(accounts) == len(WORKLOAD.sample.customers)


def test_the_domain_check_is_the_sample_oracle() -> None:
    messages = WORKLOAD.draw(random.Random(5), 2)
    orders = WORKLOAD.orders(random.Random(5), 2)
    states: dict[str, dict[str, Any]] = defaultdict(dict)
    missing = WORKLOAD.check(RunOutcome(states, [], {}, messages))
    assert {f"order {k} missing" for k in orders} <= set(missing)
