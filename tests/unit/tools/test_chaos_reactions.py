"""What `eo chaos --production` reports the services did in each fault's window
(tools/chaos/reactions.py), from log records as the processes write them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tools.chaos.production import FaultRecord
from tools.chaos.reactions import AFTER_S, describe

T0 = 1_800_000_000.0


def at(seconds: float, event: str, **fields: Any) -> dict[str, Any]:
    """A log record `seconds` after T0, with the ISO timestamp the processes write."""
    stamp = datetime.fromtimestamp(T0 + seconds, UTC).isoformat().replace("+00:00", "Z")
    return {"timestamp": stamp, "event": event, **fields}


def test_each_fault_counts_what_happened_from_its_injection_to_the_next_fault() -> None:
    first = FaultRecord("rabbitmq leader killed", "node 1", 1.0, 5.0, wall_at=T0 + 1)
    second = FaultRecord("network slow", "256 kbit/s", 9.0, 10.0, wall_at=T0 + 9)
    logs = [
        at(0.5, "message.received", endpoint="orders", message_id="a"),
        at(0.6, "message.retried", endpoint="orders"),  # before any fault: nobody's
        at(2.0, "connection to amqp://h:1/ (or its publishing channel) lost: recovering"),
        at(2.1, "consumer.lost", endpoint="orders"),
        at(2.5, "recovered the connection to amqp://h:2/ after 0.4 s"),
        at(3.0, "consumer.restarted", endpoint="orders", after_s=1.5),
        at(3.1, "message.received", endpoint="orders", message_id="a"),  # redelivered
        at(3.2, "message.received", endpoint="orders", message_id="b"),  # first time
        at(9.5, "message.retried", endpoint="orders"),  # the second fault's
        at(9.6, "message.dead_lettered", endpoint="orders"),
        at(9 + 10 + AFTER_S + 1, "message.retried", endpoint="orders"),  # past its window
    ]
    describe([second, first], reversed(logs))  # any order of records and of lines
    assert first.reactions == ("2 connections or consumers lost, back after 0.4-1.5 s; "
                               "1 consumers restarted; 1 received again; 0 retried; "
                               "0 conflicts; 0 dead-lettered")
    assert second.reactions == ("0 connections or consumers lost; 0 consumers restarted; "
                                "0 received again; 1 retried; 0 conflicts; 1 dead-lettered")
    assert second.line().startswith("9.0 s network slow: 256 kbit/s (undone after 10.0 s); 0 ")


def test_a_lagging_failover_counts_the_commits_of_its_lag() -> None:
    fault = FaultRecord("postgresql failover, standby lagging", "pg2", 0.0, 8.0, wall_at=T0,
                        lag=(T0, T0 + 5))
    logs = [at(s, "transaction.committed", endpoint="orders") for s in (1.0, 2.0, 4.9, 5.5)]
    describe([fault], logs)
    assert fault.reactions.endswith("3 transactions committed while the standby lagged")
