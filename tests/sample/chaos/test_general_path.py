"""The failure-table class that exists only on protocol 3.2's general path, with real
processes: tokens in a database of their own (`EO_TOKEN_DSN`), so consuming the incoming
token (a delete in the token database) and clearing the TR (in the endpoint's database) are
two transactions in two databases, with a window between them that no transaction closes.

One test: the row "token delete, before TR clear" on the ledger, repaired by the sweeper of
the restarted process. Its memory twin (FT::test_crash_after_token_delete_is_finished_by_the_
sweeper, below) and its PostgreSQL one (the general path in one database) prove the row; this
one proves it across two real databases, by the process's own sweeper, while every outgoing
token of the order is registered, created and re-checked in the token database.

The rows this module had besides are proven by their twins (FT:
tests/unit/application/test_failure_table.py, on the general path):

- register, create of a message token (`after_register:message`, `after_create:message`):
  FT::test_crash_after_register_leaves_a_record_the_winner_cleans[general-message],
  FT::test_crash_after_create_leaves_an_artifact_the_winner_deletes[general-message];
- a token created after the winner's clean-up, its creator dead before the re-check:
  FT::test_an_outgoing_token_created_after_the_winners_clean_up_goes_by_deferred_clean_up;
- token delete, before TR clear, repaired by the next message of the partition:
  FT::test_crash_after_token_delete_is_finished_by_the_next_message_of_the_partition, and
  on PostgreSQL (one database) tests/integration/test_postgres_protocol.py::
  test_crash_after_the_token_delete_is_repaired_without_a_second_handler_run[next_message-general].

Same harness and checks as test_failure_table.py (`Run.verify`), on a cluster whose every
process uses the separate token database.
"""

from __future__ import annotations

import pytest

from tests.sample.chaos.cluster import Run, crashed, pick_orders

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

GENERAL_PATH = True
ONE_ORDER = pick_orders(1, seed=3)


async def one_order(chaos: Run, name: str, endpoint: str, failpoints: str) -> None:
    await chaos.seed(ONE_ORDER)
    await chaos.start(name, endpoint, failpoints)
    if endpoint != "orders":
        await chaos.start("orders-a", "orders")
    await chaos.publish(ONE_ORDER.commands)


async def test_crash_after_the_token_delete_repaired_by_the_sweeper(chaos: Run) -> None:
    """Row "token delete, before TR clear" on the ledger, whose partition (the customer)
    gets no later message: the ledger process died between deleting OrderConfirmed's token
    and clearing the TR. Left: a committed TR, token gone; only the sweeper can finish it
    (stale after 1 s here). Asserted: the crash; the restarted ledger's sweeper finished a
    transaction (`sweeper.swept` with finished >= 1) before quiescence, so nothing was left
    for the final sweep; the event's handler ran once."""
    await one_order(chaos, "ledger", "ledger", "after_consume_token=crash@1")
    result = await chaos.verify()
    crashed(result, "after_consume_token", name="ledger")
    m = result.exit_of("ledger").last("token.consumed")["message_id"]
    assert result.runs("ledger", m) == 1
    swept = [e for e in result.events("sweeper.swept", endpoint="ledger")
             if int(e.get("finished", 0)) >= 1]
    assert swept, "the ledger's sweeper finished nothing"
    assert result.before_sweep["unfinished transaction records"] == 0
