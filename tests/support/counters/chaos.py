"""The counters service's declared workload for `eo chaos --workload
tests.support.counters.chaos:WORKLOAD` (tools/chaos/workload.py): Adds and Spends for five
counters, their bank accounts opened before the run, and the domain's check of a run."""

from __future__ import annotations

import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass

from tests.support.counters.endpoints import Account
from tools.chaos.workload import OutsideMessage, RunOutcome

COUNTERS = tuple(f"c{n}" for n in range(5))
#: Each account opens with this much: some Spends exhaust it (the bank refuses them, 409).
OPENING = 60


@dataclass(frozen=True)
class CountersWorkload:
    """`size` messages to the gateway: three Adds for each Spend."""

    shuffle: bool = True

    def draw(self, rng: random.Random, size: int) -> list[OutsideMessage]:
        messages = []
        for _ in range(size):
            kind = "Spend" if rng.random() < 0.25 else "Add"
            body = {"counter": rng.choice(COUNTERS), "amount": rng.randrange(1, 40)}
            messages.append(OutsideMessage("front", str(uuid.UUID(int=rng.getrandbits(128))),
                                           kind, json.dumps(body).encode()))
        return messages

    def seed_states(self, messages: list[OutsideMessage]) -> dict[str, dict[str, Account]]:
        """Every counter's bank account, opened with `OPENING` (whatever the run sends)."""
        return {"bank": {c: Account(balance=OPENING) for c in COUNTERS}}

    def check(self, outcome: RunOutcome) -> list[str]:
        """Each counter's total is the sum of its Adds; each account's debits are what its
        counter recorded as spent, and its balance the opening less them."""
        added: Counter[str] = Counter()
        for m in outcome.messages:
            if m.type == "Add":
                body = json.loads(m.body)
                added[body["counter"]] += body["amount"]
        problems = []
        counters, bank = outcome.states.get("counter", {}), outcome.states.get("bank", {})
        for name in COUNTERS:
            tally = counters.get(name)
            total = tally.total if tally is not None else 0
            if total != added[name]:
                problems.append(f"{name}: total {total}, its Adds sum to {added[name]}")
            account = bank.get(name)
            spent = sorted(tally.spent) if tally is not None else []
            if account is None or sorted(account.debits) != spent or (
                    account.balance != OPENING - sum(account.debits)):
                problems.append(f"{name}: account {account} against spent {spent}")
        return problems


WORKLOAD = CountersWorkload()
