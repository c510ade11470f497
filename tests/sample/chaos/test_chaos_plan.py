"""The campaign's fault plans: a pure function of (seed, run), valid failpoint rules, the
callee's names only for the callee, bounded faults."""

from __future__ import annotations

import pytest

from application.failpoints import parse
from tools.chaos.campaign import CALLEE_POINTS, POINTS, PROCESSES, plan_run

KEYS = list(range(1, 6001, 4))  # order keys as TPC-H numbers them (sparse)


def test_the_same_seed_and_run_give_the_same_plan_and_others_differ() -> None:
    assert plan_run(1, 3, KEYS) == plan_run(1, 3, KEYS)
    plans = {repr(plan_run(seed, run, KEYS)) for seed in (1, 2) for run in range(10)}
    assert len(plans) == 20


@pytest.mark.parametrize("seed", range(0, 400, 10))
def test_plans_hold_valid_bounded_faults(seed: int) -> None:
    plan = plan_run(seed, seed % 7, KEYS, orders_per_run=12, max_faults=4)
    assert len(set(plan.orders)) == 12
    assert set(plan.orders) <= set(KEYS)
    rules = {name: parse(spec) for name, spec in plan.failpoints.items()}
    assert sum(len(r) for r in rules.values()) + len(plan.kills) <= 4
    for process, parsed in rules.items():
        for name, rule in parsed.items():
            assert (name in CALLEE_POINTS) == (process == "payments")
            assert name in POINTS[PROCESSES[process]]  # a point the process can reach
            if process == "payments":
                assert rule.action != "drop_conn"  # the callee has no broker connection
            # each rule fires at most twice: far below the attempt limit
            assert rule.mode == "@" or (rule.mode == "*" and rule.n <= 2)
    assert all(name in PROCESSES and 0 <= at < 12 for at, name in plan.kills)
    assert 0 < plan.duplicate_rate < 1
    assert 0 <= plan.republish <= 5
