"""Protocol 3.4's failure table with processes that really die: one test per class of row.

Each test runs the sample (one TPC-H order through gateway -> orders -> payments -> orders ->
ledger) on the chaos cluster (tests/sample/chaos/cluster.py) with a process that carries the row's
failpoint, checks that the failpoint really fired (the process exited with the `crash` code
and its log names it), then, at quiescence, `Run.verify`: the oracle, nothing at rest before
the final sweep (deferred clean-ups aside) nor after it, no dead letter, the log audit (I1,
I2, I7), the event order (I4, I6), and the handler runs protocol 3.4 allows: again only after
an attempt that did not commit. The message that hit the failpoint is found in the crashed
process's log, which ends at it.

What a real process adds to a row's memory twin is the same for every row of a class: a
process killed where it stands (`os._exit`, no clean-up, no ack), RabbitMQ giving its unacked
delivery to the restarted process, and the repair done by the PostgreSQL, S3 and HTTP
adapters of another process. So one row per class stays here:

- before anything durable: `after_token_check` (the last point before the handler; on this
  co-located path `after_token_load` and `after_tr_load` follow the same read);
- after the commit: `after_commit`, the committed TR finished by the redelivery without a
  second handler run;
- during publication: `after_publish:1`, the receiver dropping the copy by its token;
- in a callee: `callee.after_commit` in the payments process, the caller's retried POST
  finishing the committed request and getting its stored response.

The caller side of HTTP (protocol 6) has no test of its own: each caller failpoint is a
token-path point of a class above (`after_put` a "create", `after_post` before anything
durable on the caller, `before_delete` / `after_delete` a publication), and every test here
runs the order's PUT, POST and DELETE against the real payments process.

Every other row is proven in memory, on the co-located and general paths, by its twin
(tests/unit/application/; FT = test_failure_table.py, HTTP = test_http_protocol.py):

- token load, TR load (`after_token_load`, `after_tr_load`):
  FT::test_crash_before_anything_durable_leaves_nothing;
- register, blob / HTTP request: FT::test_crash_after_register_leaves_a_record_the_winner_cleans,
  HTTP::test_a_crash_before_the_request_or_the_commit_leaves_a_record_the_winner_cleans;
- create, blob / HTTP request (also caller `after_put`):
  FT::test_crash_after_create_leaves_an_artifact_the_winner_deletes,
  HTTP::test_crash_after_put_leaves_a_request_the_next_winner_deletes;
- commit rejected (error), and a crash just before the commit:
  FT::test_rejected_commit_leaves_records_and_artifacts_the_retry_cleans,
  HTTP::test_a_commit_rejected_by_an_error_is_retried_and_the_winner_deletes_its_request and
  HTTP::test_a_crash_before_the_request_or_the_commit_leaves_a_record_the_winner_cleans;
- all dispatches (`after_publish_all`):
  FT::test_crash_after_commit_is_finished_by_redelivery_without_a_second_handler_run,
  FT::test_a_repeated_publication_never_recreates_an_outgoing_token_already_consumed;
- TR clear, before ack (`after_tr_clear`, `before_ack`):
  FT::test_crash_after_clear_leaves_nothing_and_redelivery_is_dropped;
- caller `after_post`, `before_delete`, `after_delete`:
  HTTP::test_crash_around_the_follow_ups_post_and_delete_is_repaired_by_redelivery;
- callee `callee.before_reply`: HTTP::test_crash_before_the_reply_is_answered_identically_on_retry
  (the callee), HTTP::test_a_callee_that_dies_answering_the_post_is_asked_again_and_debits_once
  (its caller).

One order's finalising message (the last of its k commands to arrive) is the k-th commit of
the only orders process, and the only decision with artifacts (an invoice blob, an HTTP
request, the follow-up message), so `...@k` aims at it. This module runs on the co-located
fast path (tokens in the endpoint database, the default); `test_general_path.py` has the class
that exists only on the general path.
"""

from __future__ import annotations

import pytest

from tests.sample.chaos.cluster import Run, crashed, pick_orders

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

ONE_ORDER = pick_orders(1, seed=1)
#: the finalising message of ONE_ORDER is the orders process's K-th commit
K = len(ONE_ORDER.commands)


async def one_order(chaos: Run, failpoints: str, name: str = "orders-a") -> None:
    """ONE_ORDER through the cluster, the orders process `name` carrying `failpoints`."""
    await chaos.seed(ONE_ORDER)
    await chaos.start(name, "orders", failpoints)
    await chaos.publish(ONE_ORDER.commands)


# ---------------------------------------------------------------------------------------------
# before anything durable: token load, TR load, token check


async def test_crash_before_the_handler_leaves_nothing(chaos: Run) -> None:
    """Row "token load, TR load, token check", at its last point (`after_token_check`): left
    behind nothing; repaired by the redelivery, processed normally. Asserted: the orders
    process crashed there; every message's handler ran exactly once (the crashed delivery
    never reached it); the checks of `verify`."""
    await one_order(chaos, "after_token_check=crash@1")
    result = await chaos.verify()
    crashed(result, "after_token_check")
    runs = {key: n for key, n in result.audit.handler_runs.items() if n != 1}
    assert runs == {}, runs


# ---------------------------------------------------------------------------------------------
# after the commit: commit with unknown outcome, commit before publish


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
# during publication: some or all dispatches


async def test_crash_during_publication(chaos: Run) -> None:
    """Row "some or all dispatches": the finalising transaction's follow-up message was
    dispatched (`after_publish:1`), then the process died inside `finish` (token not
    consumed, TR committed). Left: a partial publication. Repaired by finishing again (the
    redelivery, the follow-up's own processing, or the sweeper), which dispatches the
    follow-up again under the same ID; the receiver drops the second copy by its token.
    Asserted: the crash; the follow-up was received at least twice, every copy with the same
    body (audit I2), and its handler ran once; the finalising message's handler ran once."""
    await one_order(chaos, "after_publish:1=crash@1")
    result = await chaos.verify()
    crashed(result, "after_publish:1")
    dispatched = result.exit_of("orders-a").last("side_effect.published")
    m, follow_up = dispatched["message_id"], dispatched["key"]
    assert dispatched["kind"] == "message"
    assert result.runs("orders", m) == 1
    assert result.audit.received[("orders", follow_up)] >= 2
    assert result.runs("orders", follow_up) == 1
    assert result.events("message.duplicate", endpoint="orders", message_id=follow_up)


# ---------------------------------------------------------------------------------------------
# in a callee: the HTTP callee (payments) dies after its commit


async def test_callee_crash(chaos: Run) -> None:
    """Callee `callee.after_commit`: payments committed the payment, then its process died
    before finishing it: the caller's POST fails and the follow-up is retried while the
    callee restarts. Left: a committed request; repaired by the retried POST, which
    finishes it and answers the stored response. Asserted: payments crashed there; the
    payment's handler ran once and committed once; the follow-up was retried and its handler
    ran once; the oracle (one debit) holds."""
    await chaos.start("payments", "payments", "callee.after_commit=crash@1")
    await one_order(chaos, "")
    result = await chaos.verify()
    crashed(result, "callee.after_commit", name="payments")
    request = result.exit_of("payments").last("transaction.committed")["message_id"]
    assert result.runs("payments", request) == 1
    assert result.commits("payments", request) == 1
    [retried, *_] = result.events("message.retried", endpoint="orders")
    assert result.runs("orders", retried["message_id"]) == 1
