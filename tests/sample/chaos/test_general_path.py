"""The failure-table rows that exist only on protocol 3.2's general path, with real
processes: tokens in a database of their own (`EO_TOKEN_DSN`), so every outgoing message's
token is registered, created and re-checked like any artifact, and consuming the incoming
token (delete) and clearing the TR are two steps with a window between them.

Same harness and checks as test_failure_table.py (`Run.verify`), on a cluster whose every
process uses the separate token database.
"""

from __future__ import annotations

import pytest

from tests.sample.chaos.cluster import Run, crashed, pick_orders, replaced_after_crash

GENERAL_PATH = True
ONE_ORDER = pick_orders(1, seed=3)


async def one_order(chaos: Run, name: str, endpoint: str, failpoints: str) -> None:
    await chaos.seed(ONE_ORDER)
    await chaos.start(name, endpoint, failpoints)
    if endpoint != "orders":
        await chaos.start("orders-a", "orders")
    await chaos.publish(ONE_ORDER.commands)


@pytest.mark.parametrize("point", ["after_register", "after_create"])
async def test_crash_after_registering_or_creating_a_message_token(chaos: Run,
                                                                   point: str) -> None:
    """Rows "register" and "create" for the message kind: the finalising attempt registered
    (and, for `after_create`, created in the token database) the token of its follow-up
    message, then died. Left: a record (and a token nobody will dispatch); repaired by the
    next winner's clean-up, which deletes the token. Asserted: the crash; the handler ran
    twice and committed once by the other attempt; the winner cleaned the crashed attempt's
    message record; no token left before the final sweep (`verify`)."""
    await one_order(chaos, "orders-a", "orders", f"{point}:message=crash@1")
    result = await chaos.verify()
    replaced_after_crash(result, f"{point}:message", "message")


async def test_artifact_created_after_the_winners_clean_up_is_left_to_the_deferred_clean_up(
        chaos: Run) -> None:
    """Row "create", its last clause: an artifact created after the winner's clean-up whose
    creator crashed before the re-check; only the deferred clean-up (protocol 8.2) deletes it.
    orders-a alone takes the finalising message and pauses after registering the invoice
    blob until orders-b consumes; orders-a then drops its connection after creating the
    payment request (the delivery goes to orders-b, which pauses before its handler until
    orders-a has registered its follow-up's token) and pauses after registering that token
    until orders-b has finished; orders-b wins and its finish cleans orders-a's records
    (blob, request deleted; the token not created yet: a no-op) and moves them to the
    deferred clean-ups; orders-a goes on, creates the token, and dies before its re-check.
    Left: an orphan token no one will dispatch. Each pause waits for the other process's
    event (a `wait:<gate>` failpoint), not for a time: the order holds on a loaded machine.
    Asserted: the crash; the winner was orders-b's attempt and cleaned orders-a's message
    record; that token was still there when the system was quiet (with its deferred clean-up
    due), and the final sweep (grace period passed) deleted it."""
    await chaos.seed(ONE_ORDER)
    await chaos.start("orders-a", "orders", ";".join([
        "after_register:blob=wait:b-consuming@1", "after_create:http_request=drop_conn@1",
        "after_register:message=wait:b-finished@1", "after_create:message=crash@1"]))
    await chaos.publish(ONE_ORDER.commands)
    await chaos.logged("orders-a", "fault.injected", failpoint="after_register:blob")
    # orders-b's first delivery is the requeued copy: it waits before its handler until
    # orders-a has registered its token (so orders-b's finish has that record to clean up)
    await chaos.start("orders-b", "orders", "after_token_check=wait:a-registered@1")
    chaos.open_gate("orders-a", "b-consuming")
    await chaos.logged("orders-a", "fault.injected", failpoint="after_register:message")
    chaos.open_gate("orders-b", "a-registered")
    # orders-b's finish: orders-a's message record cleaned up (deferred), the token consumed
    won = await chaos.logged("orders-b", "side_effect.cleaned", kind="message")
    await chaos.logged("orders-b", "token.consumed", message_id=str(won["message_id"]))
    chaos.open_gate("orders-a", "b-finished")
    await chaos.exited("orders-a")  # it goes on after the winner and dies creating the token
    result = await chaos.verify(orphan_tokens=1)
    crashed(result, "after_create:message")
    loser = result.exit_of("orders-a").last("handler.invoked")
    m = loser["message_id"]
    [commit] = result.events("transaction.committed", endpoint="orders", message_id=m)
    assert commit["attempt_id"] != loser["attempt_id"]
    assert any(commit["attempt_id"] in line for line in chaos.lines("orders-b"))
    [orphan] = [str(e["key"]) for e in result.events(
        "side_effect.cleaned", endpoint="orders", loser_attempt_id=loser["attempt_id"],
        kind="message")]
    assert result.tokens_before == {orphan}
    assert result.before_sweep["aborted artifacts (deferred clean-ups)"] >= 1
    assert result.after_sweep["tokens"] == 0


async def test_crash_after_the_token_delete_repaired_by_the_next_message(chaos: Run) -> None:
    """Row "token delete, before TR clear" on orders: the first message the orders process
    finished had its token deleted, then the process died before clearing the TR. Left: a
    committed TR whose token is gone (its redelivery is a duplicate at the token load and
    cannot finish it); repaired by the next message on the partition (or the sweeper).
    Asserted: the crash; the message's handler ran once; its redelivery was a duplicate; no
    unfinished TR left before the final sweep."""
    await one_order(chaos, "orders-a", "orders", "after_consume_token=crash@1")
    result = await chaos.verify()
    crashed(result, "after_consume_token")
    m = result.exit_of("orders-a").last("token.consumed")["message_id"]
    assert result.runs("orders", m) == 1
    assert result.events("message.duplicate", endpoint="orders", message_id=m)
    assert result.before_sweep["unfinished transaction records"] == 0


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
