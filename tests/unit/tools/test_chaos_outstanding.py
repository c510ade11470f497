"""What a campaign on its own cluster counts as still to do (tools/chaos/production.py
`ProductionServers.messages`, read by tools/chaos/quiet.py `outstanding`): the queues that
hold messages, ready and unacked apart, from `rabbitmqctl list_queues`' lines."""

from __future__ import annotations

from tools.chaos.production import ProductionServers


async def test_the_cluster_counts_ready_and_unacked_messages_per_queue() -> None:
    servers = object.__new__(ProductionServers)  # no servers: only the CLI's answer

    async def ask(*args: str, timeout_s: float) -> str:
        assert args == ("list_queues", "name", "messages_ready", "messages_unacknowledged",
                        "--no-table-headers")
        assert timeout_s == 5.0  # short: the loop that asks also restarts crashed processes
        return ("orders\t0\t8\n"  # delivered, not yet acked
                "orders.retry.100ms\t5\t0\n"
                "gateway\t0\t0\n"  # empty: left out
                "payments\t3\t1\n"  # not asked for
                "ledger\t\t\n")  # a queue without a leader counts nothing

    servers._ask = ask  # type: ignore[method-assign]
    held = await servers.messages(["orders", "orders.retry.100ms", "gateway", "ledger"])
    assert held == {"orders": (0, 8), "orders.retry.100ms": (5, 0)}
