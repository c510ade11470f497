"""Protocol 3.4's failure table with processes that really die: one test per row, plus the
HTTP caller and callee failpoints (protocol 6, 10).

Each test runs the sample (one TPC-H order through gateway -> orders -> payments -> orders ->
ledger) on the chaos cluster (tests/sample/chaos/cluster.py) with a process that carries the row's
failpoint, checks that the failpoint really fired (the process exited with the `crash` code
and its log names it, or the log shows the action), then, at quiescence, `Run.verify`: the
oracle, nothing at rest before the final sweep (deferred clean-ups aside) nor after it, no
dead letter, the log audit (I1, I2, I7), the event order (I4, I6), and the handler runs
protocol 3.4 allows: again only after an attempt that did not commit. The message that hit
the failpoint is found in the crashed process's log, which ends at it.

One order's finalising message (the last of its k commands to arrive) is the k-th commit of
the only orders process, and the only decision with artifacts (an invoice blob, an HTTP
request, the follow-up message), so `...@k` and the `:<kind>` failpoints aim at it. This
module runs on the co-located fast path (tokens in the endpoint database, the default);
`test_general_path.py` has the rows that exist only on the general path.
"""

from __future__ import annotations

import pytest

from tests.sample.chaos.cluster import (
    Run,
    crashed,
    loser_cleaned,
    pick_orders,
    replaced_after_crash,
)

ONE_ORDER = pick_orders(1, seed=1)
#: the finalising message of ONE_ORDER is the orders process's K-th commit
K = len(ONE_ORDER.commands)


async def one_order(chaos: Run, failpoints: str, name: str = "orders-a") -> None:
    """ONE_ORDER through the cluster, the orders process `name` carrying `failpoints`."""
    await chaos.seed(ONE_ORDER)
    await chaos.start(name, "orders", failpoints)
    await chaos.publish(ONE_ORDER.commands)


# ---------------------------------------------------------------------------------------------
# token load, TR load, token check: nothing left, redelivery processes normally


@pytest.mark.parametrize("failpoint", ["after_token_load", "after_tr_load", "after_token_check"])
async def test_crash_before_the_handler_leaves_nothing(chaos: Run, failpoint: str) -> None:
    """Row "token load, TR load, token check": left behind nothing; repaired by the
    redelivery, processed normally. Asserted: the orders process crashed there; every
    message's handler ran exactly once (the crashed delivery never reached it); the checks
    of `verify`."""
    await one_order(chaos, f"{failpoint}=crash@1")
    result = await chaos.verify()
    crashed(result, failpoint)
    runs = {key: n for key, n in result.audit.handler_runs.items() if n != 1}
    assert runs == {}, runs


# ---------------------------------------------------------------------------------------------
# register, create: the next winner's clean-up


@pytest.mark.parametrize("kind", ["blob", "http_request"])
async def test_crash_after_register(chaos: Run, kind: str) -> None:
    """Row "register": the finalising attempt registered its `kind` record and died before
    creating the artifact. Left: a record without an artifact; repaired by the next winner's
    clean-up (a no-op delete). Asserted: the crash; the finalising message's handler ran
    twice (crashed attempt, winner) and committed once, by the other attempt; the winner's
    finish cleaned the crashed attempt's `kind` record; nothing at rest (no record left)."""
    await one_order(chaos, f"after_register:{kind}=crash@1")
    result = await chaos.verify()
    replaced_after_crash(result, f"after_register:{kind}", kind)


@pytest.mark.parametrize("kind", ["blob", "http_request"])
async def test_crash_after_create(chaos: Run, kind: str) -> None:
    """Row "create": the finalising attempt created its invoice blob (an S3 object) or its
    payment request (a PUT on the payments process) and died before the re-check. Left: an
    artifact of a losing attempt; repaired by the next winner's clean-up on the partition.
    Asserted: the crash; handler ran twice, committed once by the other attempt; the winner
    cleaned the artifact; before the final sweep the bucket held exactly the winner's
    invoice and payments no request (the oracle and `verify` check the rest)."""
    await one_order(chaos, f"after_create:{kind}=crash@1")
    result = await chaos.verify()
    replaced_after_crash(result, f"after_create:{kind}", kind)
    assert set(result.blobs_before) == result.invoices
    assert result.before_sweep["requests on payments"] == 0


# ---------------------------------------------------------------------------------------------
# commit rejected, commit with unknown outcome, commit before publish


async def test_commit_rejected_by_an_error(chaos: Run) -> None:
    """Row "commit rejected (error)": the finalising attempt prepared everything (blob,
    request) and its commit failed (`before_commit=raise`): a transient error, the delivery
    goes to delayed redelivery. Left: the attempt's records and artifacts; repaired by the
    retry, whose winning finish cleans them. Asserted: the message was retried once; the
    handler ran twice, committed once by the retry's attempt; the failed attempt's blob and
    request were cleaned by the winner; nothing left before the final sweep.
    (Rejection by a conflict: test_scenarios.py, concurrent copies.)"""
    await one_order(chaos, f"before_commit=raise@{K}")
    result = await chaos.verify()
    [retried] = result.events("message.retried", endpoint="orders")
    m = retried["message_id"]
    assert "failpoint before_commit" in retried["reason"]
    assert result.runs("orders", m) == 2
    abandoned = {e["attempt_id"] for e in result.events(  # a batch's runs, left at once
        "attempt.abandoned", endpoint="orders", message_id=m)}
    invoked = [e for e in result.events("handler.invoked", endpoint="orders", message_id=m)
               if e["attempt_id"] not in abandoned]
    [commit] = result.events("transaction.committed", endpoint="orders", message_id=m)
    [loser] = [e["attempt_id"] for e in invoked if e["attempt_id"] != commit["attempt_id"]]
    assert loser_cleaned(result, loser) == {"blob", "http_request"}
    assert set(result.blobs_before) == result.invoices


async def test_crash_before_the_commit(chaos: Run) -> None:
    """A crash between the re-checks and the commit (`before_commit=crash`): as for a
    rejected commit, the attempt's records and artifacts are left; repaired by the
    redelivery, whose winning attempt's finish cleans them. Asserted: the crash; the
    finalising message's handler ran twice, committed once by the other attempt; the winner
    cleaned the crashed attempt's blob and request; only the winner's invoice and no request
    before the final sweep."""
    await one_order(chaos, f"before_commit=crash@{K}")
    result = await chaos.verify()
    crashed(result, "before_commit")
    attempt = result.exit_of("orders-a").last("handler.invoked")
    m, loser = attempt["message_id"], attempt["attempt_id"]
    assert result.runs("orders", m) == 2
    [commit] = result.events("transaction.committed", endpoint="orders", message_id=m)
    assert commit["attempt_id"] != loser
    assert loser_cleaned(result, loser) == {"blob", "http_request"}
    assert set(result.blobs_before) == result.invoices
    assert result.before_sweep["requests on payments"] == 0


async def test_crash_after_commit_finishes_without_running_the_handler_again(
        chaos: Run) -> None:
    """Rows "commit with unknown outcome" and "commit, before publish": the process dies
    right after committing the finalising decision, before `finish` (it never saw the
    outcome). Left: a committed TR. Repaired by the redelivery of the message, which finds
    the TR committed to it and only finishes: the handler is not run again. Asserted: the
    crash; the committed message's handler ran once, committed once; its redelivery was a
    duplicate; the follow-up was published (by a later process) from the committed attempt,
    under one message ID."""
    await one_order(chaos, f"after_commit=crash@{K}")
    result = await chaos.verify()
    crashed(result, "after_commit")
    committed = result.exit_of("orders-a").last("transaction.committed")
    m = committed["message_id"]
    assert result.runs("orders", m) == 1
    assert result.commits("orders", m) == 1
    assert result.events("message.duplicate", endpoint="orders", message_id=m)
    # published by the redelivery's finish (maybe also by the sweeper's: idempotent)
    published = result.events("side_effect.published", endpoint="orders", message_id=m)
    assert {(p["kind"], p["attempt_id"]) for p in published} == {
        ("message", committed["attempt_id"])}, published
    assert len({p["key"] for p in published}) == 1


# ---------------------------------------------------------------------------------------------
# some or all dispatches


@pytest.mark.parametrize("failpoint", ["after_publish:1=crash@1", f"after_publish_all=crash@{K}"])
async def test_crash_during_publication(chaos: Run, failpoint: str) -> None:
    """Row "some or all dispatches": the finalising transaction's follow-up message was
    dispatched, then the process died inside `finish` (token not consumed, TR committed).
    Left: a partial (or complete) publication. Repaired by finishing again (the redelivery,
    the follow-up's own processing, or the sweeper), which dispatches the follow-up again
    under the same ID; the receiver drops the second copy by its token. Asserted: the crash;
    the follow-up was received at least twice, every copy with the same body (audit I2), and
    its handler ran once; the finalising message's handler ran once."""
    await one_order(chaos, failpoint)
    result = await chaos.verify()
    crashed(result, failpoint.split("=")[0])
    dispatched = result.exit_of("orders-a").last("side_effect.published")
    m, follow_up = dispatched["message_id"], dispatched["key"]
    assert dispatched["kind"] == "message"
    assert result.runs("orders", m) == 1
    assert result.audit.received[("orders", follow_up)] >= 2
    assert result.runs("orders", follow_up) == 1
    assert result.events("message.duplicate", endpoint="orders", message_id=follow_up)


# ---------------------------------------------------------------------------------------------
# TR clear, before ack


@pytest.mark.parametrize("failpoint", ["after_tr_clear", "before_ack"])
async def test_crash_after_the_transaction_was_cleared(chaos: Run, failpoint: str) -> None:
    """Row "TR clear, before ack": the message was processed and consumed (token gone, TR
    idle), the process died before the ack. Left: nothing; repaired by the token check: the
    redelivery is dropped. Asserted: the crash; the message (the last the crashed process
    consumed) was received again and dropped as a duplicate; its handler ran once."""
    await one_order(chaos, f"{failpoint}=crash@1")
    result = await chaos.verify()
    crashed(result, failpoint)
    m = result.exit_of("orders-a").last("token.consumed")["message_id"]
    assert result.audit.received[("orders", m)] >= 2
    assert result.events("message.duplicate", endpoint="orders", message_id=m)
    assert result.runs("orders", m) == 1


# ---------------------------------------------------------------------------------------------
# HTTP caller (orders) and callee (payments) failpoints


async def test_caller_crash_after_put(chaos: Run) -> None:
    """Caller `after_put` (a "create" of an HTTP request): the request is stored on payments,
    the attempt dies before its re-check. Left: a request of a losing attempt on the callee;
    repaired by the next winner's clean-up, which DELETEs it. Asserted: the crash; handler
    ran twice, committed once by the other attempt; the winner cleaned the loser's request;
    no request on payments before the final sweep."""
    await one_order(chaos, "after_put=crash@1")
    result = await chaos.verify()
    crashed(result, "after_put")
    attempt = result.exit_of("orders-a").last("handler.invoked")
    m, loser = attempt["message_id"], attempt["attempt_id"]
    assert result.runs("orders", m) == 2
    assert "http_request" in loser_cleaned(result, loser)
    assert result.before_sweep["requests on payments"] == 0


async def test_caller_crash_after_post(chaos: Run) -> None:
    """Caller `after_post`: the follow-up's POST made payments process the payment, then the
    caller died before its handler. Left: an answered request (the stored response);
    repaired by the redelivered follow-up, whose POST gets the same stored response. Asserted:
    the crash; the payment was processed once (one handler run on payments for the request),
    the follow-up's handler ran once; the oracle (debits = confirmed totals) holds."""
    await one_order(chaos, "after_post=crash@1")
    result = await chaos.verify()
    crashed(result, "after_post")
    follow_up = result.exit_of("orders-a").last("message.received")
    assert follow_up["type"] == "PaymentResult"
    assert result.runs("orders", follow_up["message_id"]) == 1
    payments = {k: n for k, n in result.audit.handler_runs.items() if k[0] == "payments"}
    assert list(payments.values()) == [1], payments


@pytest.mark.parametrize("failpoint", ["before_delete", "after_delete"])
async def test_caller_crash_around_the_delete(chaos: Run, failpoint: str) -> None:
    """Caller `before_delete` / `after_delete`: the follow-up's transaction committed (an
    `http delete` record and OrderConfirmed); `finish` died around the DELETE of the request,
    its first publication. Left: a committed TR, the request (and response) maybe still on
    payments. Repaired by finishing again: DELETE (idempotent, tombstone) and dispatch.
    Asserted: the crash; the follow-up's handler ran once; the DELETE was published by a
    later finish; no request left on payments before the final sweep."""
    await one_order(chaos, f"{failpoint}=crash@1")
    result = await chaos.verify()
    crashed(result, failpoint)
    m = result.exit_of("orders-a").last("transaction.committed")["message_id"]
    assert result.runs("orders", m) == 1
    deletes = result.events("side_effect.published", endpoint="orders", message_id=m,
                            kind="http_delete")
    assert deletes, "nobody finished the DELETE"
    assert result.before_sweep["requests on payments"] == 0


@pytest.mark.parametrize("failpoint", ["callee.after_commit", "callee.before_reply"])
async def test_callee_crash(chaos: Run, failpoint: str) -> None:
    """Callee `callee.after_commit` / `callee.before_reply`: payments committed the payment
    (and, before the reply, finished it), then its process died: the caller's POST fails
    and the follow-up is retried while the callee restarts. Left: a committed (or answered)
    request; repaired by the retried POST, which finishes and answers the stored response.
    Asserted: payments crashed there; the payment's handler ran once and committed once;
    the follow-up was retried and its handler ran once; the oracle (one debit) holds."""
    await chaos.start("payments", "payments", f"{failpoint}=crash@1")
    await one_order(chaos, "")
    result = await chaos.verify()
    crashed(result, failpoint, name="payments")
    request = result.exit_of("payments").last("transaction.committed")["message_id"]
    assert result.runs("payments", request) == 1
    assert result.commits("payments", request) == 1
    [retried, *_] = result.events("message.retried", endpoint="orders")
    assert result.runs("orders", retried["message_id"]) == 1
