"""The chaos scenarios of issue 5 with real processes: concurrent copies on two consumer
processes where one stalls with its connection closed, an ack lost after the token was
consumed, a commit whose outcome the caller did not see, a crash between two dispatches of one
decision, a poison message dead-lettered after its retries followed by a valid message on the
same partition, and a duplicate re-published long after processing.

Every test ends with `Run.verify` (tests/sample/chaos/cluster.py): the oracle, nothing at rest, the
dead letters expected, the log audit (I1, I2, I7), the event order (I4, I6) and handler re-runs
only after an attempt that visibly did not commit (protocol 3.4); then the scenario's own
assertions.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from types import MappingProxyType

import pytest

from application.codec import encode
from application.envelope import REQUEST_URL_HEADER, TOKEN_HEADER, Envelope
from domain.sample.messages import PaymentResult
from tests.sample.chaos.cluster import Run, Verified, crashed, pick_orders

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

ONE_ORDER = pick_orders(1, seed=2)
K = len(ONE_ORDER.commands)


def follow_ups(result: Verified) -> set[str]:
    """IDs of the payment follow-ups (PaymentResult) orders received."""
    return {str(e["message_id"]) for e in result.events("message.received", endpoint="orders",
                                                        type="PaymentResult")}


def finalised(result: Verified) -> str:
    """The orders message whose transaction sent the payment follow-up (the finalising one:
    invoice blob, payment request, follow-up)."""
    [m] = {str(e["message_id"]) for e in result.events("side_effect.published",
                                                        endpoint="orders", kind="message")
           if str(e["key"]) in follow_ups(result)}
    return m


async def _concurrent_copies(chaos: Run, failpoints: str,
                             release: Callable[[], Awaitable[None]] | None = None
                             ) -> tuple[Verified, str]:
    await chaos.seed(ONE_ORDER)
    await chaos.start_many(("orders-a", "orders", failpoints), ("orders-b", "orders", failpoints))
    await chaos.publish(ONE_ORDER.commands)
    if release is not None:
        await release()
    result = await chaos.verify()
    m = finalised(result)
    invoked_by = {name for name in ("orders-a", "orders-b")
                  if any(m in line and '"handler.invoked"' in line for line in chaos.lines(name))}
    assert invoked_by == {"orders-a", "orders-b"}, "the copy did not reach the other process"
    assert result.commits("orders", m) == 1
    conflicts = result.events("transaction.conflict", endpoint="orders", message_id=m)
    # every attempt but the winner aborted on a conflict (the rule `verify` applies to all)
    assert result.runs("orders", m) == 1 + len(conflicts), conflicts
    # nothing of a losing attempt remains, without waiting for the deferred clean-up
    assert set(result.blobs_before) == result.invoices
    assert result.before_sweep["requests on callees"] == 0
    return result, m


async def test_concurrent_copies_stall_after_creating_and_the_loser_commit_conflicts(
        chaos: Run) -> None:
    """Two orders processes, both set to drop their broker connection after registering the
    payment request and then to pause after creating it. The first to finalise drops (its
    delivery is requeued: a concurrent copy for the other process) and pauses with blob and
    request created; the other takes the copy, does the same, and pauses too. The test then
    lets the first go on: it re-checks (still valid: nothing committed) and commits: refused,
    the other's registrations moved the TR version (row "commit rejected (conflict)"); then
    the other. Each pause is a `wait:<gate>` failpoint the test opens once both paused, so
    the order holds however slow the machine. Left: both attempts' records and artifacts;
    repaired by the winner's clean-up. Asserted: both processes ran the handler and dropped
    their connection; one commit; every other attempt ended in a conflict, one of them a
    refused commit; the bucket held only the winner's invoice and payments no request before
    the final sweep."""

    async def release() -> None:
        dropped: dict[str, str] = {}
        paused: dict[str, str] = {}
        for name in ("orders-a", "orders-b"):
            paused[name] = str((await chaos.logged(
                name, "fault.injected", failpoint="after_create:http_request"))["timestamp"])
            dropped[name] = str((await chaos.logged(
                name, "fault.injected", failpoint="after_register:http_request"))["timestamp"])
        first, then = sorted(dropped, key=dropped.__getitem__)  # the first to register
        chaos.open_gate(first, "created")
        # its commit, refused: the first conflict since its pause (an earlier message of the
        # order may have conflicted in that process before; the partition's later ones wait
        # behind this attempt). Taking that one opened both gates at once, and the other's
        # commit could come first: this one's re-check failed instead (a CI run).
        await chaos.logged(first, "transaction.conflict", since=paused[first])
        chaos.open_gate(then, "created")

    result, m = await _concurrent_copies(
        chaos, "after_register:http_request=drop_conn@1;after_create:http_request=wait:created@1",
        release)
    reasons = [str(e["reason"]) for e in result.events("transaction.conflict",
                                                        endpoint="orders", message_id=m)]
    assert any("commit at" in r for r in reasons), reasons
    for name in ("orders-a", "orders-b"):
        assert any("dropping the connection" in line for line in chaos.lines(name)), name


async def test_concurrent_copies_stall_after_registering_and_the_other_wins(
        chaos: Run) -> None:
    """Two orders processes, both set to drop their connection after registering the invoice
    blob and then stall 5 s after registering the payment request (before creating it). The
    first to finalise drops and stalls; the other takes the requeued copy and stalls the same
    way; the first wakes and its commit is refused (the other registered since) and its retry
    runs the handler again and commits, or the other wakes first and wins. Whoever stalled
    longest creates its request after the winner's clean-up: its re-check fails and it deletes
    the request itself (protocol 3.2, step 3), or, when the winner's clean-up deleted its
    registered request first, its PUT meets the callee's tombstone (410). Left: nothing of
    the losers; repaired by the winner's clean-up and the re-check. Asserted: both processes
    ran the handler; one commit; every other attempt conflicted, one of them on its re-check,
    a refused commit or a 410; only the winner's invoice and no request before the final
    sweep."""
    result, m = await _concurrent_copies(
        chaos, "after_register:blob=drop_conn@1;after_register:http_request=sleep:5000@1")
    reasons = [str(e["reason"]) for e in result.events("transaction.conflict",
                                                        endpoint="orders", message_id=m)]
    # the late one meets the winner's work at its re-check, at its commit, or (when the
    # winner's clean-up already deleted its registered request, under load) at the PUT: 410
    assert any("registration gone" in r or "commit at" in r
               or "deleted by another attempt's clean-up" in r for r in reasons), reasons


async def test_ack_lost_after_the_token_was_consumed(chaos: Run) -> None:
    """The orders process loses its broker connection between consuming a message (token
    deleted, TR cleared) and acking it (`before_ack=drop_conn`): the ack fails, the broker
    redelivers. Left: nothing; the redelivery is dropped by the token check. Asserted: the
    settlement failed (logged) for that message; it was received again and dropped as a
    duplicate; its handler ran once; the process stayed up."""
    await chaos.seed(ONE_ORDER)
    await chaos.start("orders-a", "orders", "before_ack=drop_conn@1")
    await chaos.publish(ONE_ORDER.commands)
    result = await chaos.verify()
    lost = result.events("message.settlement_failed", endpoint="orders")
    assert lost, "no settlement failed"
    assert any("dropping the connection" in line for line in chaos.lines("orders-a"))
    # the first is the failpoint's ack; deliveries in flight on the dropped connection
    # failed to settle as well: each of them was processed and is then dropped the same way
    for m in {str(e["message_id"]) for e in lost}:
        assert result.audit.received[("orders", m)] >= 2, m
        assert result.events("message.duplicate", endpoint="orders", message_id=m), m
        assert result.runs("orders", m) == 1, m
    assert result.exits == []


async def test_commit_whose_outcome_the_caller_did_not_see(chaos: Run) -> None:
    """Row "commit with unknown outcome" without a crash: the finalising commit succeeds but
    the processor gets an error instead of its outcome (`after_commit=raise`), so the delivery
    goes to delayed redelivery. Left: a committed TR. Repaired by the retry, which reloads the
    TR, finds it committed to this message and only finishes. Asserted: the message was
    retried; its handler ran once and committed once; the retry was a duplicate; the
    follow-up was published from the committed attempt."""
    await chaos.seed(ONE_ORDER)
    await chaos.start("orders-a", "orders", f"after_commit=raise@{K}")
    await chaos.publish(ONE_ORDER.commands)
    result = await chaos.verify()
    [retried] = result.events("message.retried", endpoint="orders")
    m = retried["message_id"]
    assert "failpoint after_commit" in retried["reason"]
    assert result.runs("orders", m) == 1
    [commit] = result.events("transaction.committed", endpoint="orders", message_id=m)
    assert result.events("message.duplicate", endpoint="orders", message_id=m)
    published = result.events("side_effect.published", endpoint="orders", message_id=m)
    assert published
    assert {p["attempt_id"] for p in published} == {commit["attempt_id"]}


async def test_crash_between_two_dispatches_of_one_decision(chaos: Run) -> None:
    """The payment follow-up's decision has two publications (three for a confirmed order):
    the DELETE of the request on payments, then OrderConfirmed to the ledger (and the
    carrier's follow-up to orders). The orders process dies between them (its
    second `after_publish:1`; the first is the finalising decision's follow-up). Left: a
    partial publication (request deleted, nothing sent to the ledger), the TR committed.
    Repaired by finishing again (redelivery, sweeper): DELETE again (idempotent), dispatch.
    Asserted: the crash, after the DELETE and before any OrderConfirmed; the follow-up's
    handler ran once; OrderConfirmed (or OrderRejected) was then published under one ID and
    the ledger recorded the order once (oracle)."""
    await chaos.seed(ONE_ORDER)
    await chaos.start("orders-a", "orders", "after_publish:1=crash@2")
    await chaos.publish(ONE_ORDER.commands)
    result = await chaos.verify()
    crashed(result, "after_publish:1")
    process = result.exit_of("orders-a")
    last = process.last("side_effect.published")
    m = last["message_id"]
    assert last["kind"] == "http_delete"
    assert not [e for e in process.events("side_effect.published")
                if e["message_id"] == m and e["kind"] == "message"]
    assert result.runs("orders", m) == 1
    published = {e["key"] for e in result.events("side_effect.published", endpoint="orders",
                                                  message_id=m, kind="message")}
    # the outcome to the ledger under one ID and, for a confirmed order, the carrier's
    # follow-up (protocol 12) to orders under one ID, each processed once
    to_ledger = {k for k in published if result.audit.runs("ledger", k)}
    assert len(to_ledger) == 1
    assert result.audit.runs("ledger", to_ledger.pop()) == 1
    shipments = {e["message_id"] for e in result.events("api.called", endpoint="orders")}
    assert published - {k for k in published if result.audit.runs("ledger", k)} == shipments
    assert all(result.runs("orders", k) == 1 for k in shipments)


async def test_poison_message_dead_lettered_then_a_valid_message_on_its_partition(
        chaos: Run) -> None:
    """A poison message: a PaymentResult follow-up naming a request on the payments callee
    while that callee is down, so every delivery fails transiently (connection refused) until
    its retries are exhausted (EO_MAX_ATTEMPTS=3 on this orders process) and it is
    dead-lettered with the reason; its token stays (protocol 7: a replay is processed
    normally). Then payments is back and the order of the same partition arrives and is
    processed normally. Asserted: one dead letter on orders with "retries exhausted", its
    token the only one left; the poison's handler never ran; the partition's later messages
    ran once each and the order settled (oracle)."""
    await chaos.seed(ONE_ORDER)
    await chaos.start("orders-a", "orders", "", {"EO_MAX_ATTEMPTS": "3"})
    await asyncio.to_thread(chaos.cluster.stop, "payments")
    [order_key] = ONE_ORDER.expected
    url = f"{chaos.cluster.fleet.callee_urls['payments']}/requests/{uuid.uuid4()}"
    poison = await chaos.send_with_token("orders", PaymentResult(order_key),
                                         headers={REQUEST_URL_HEADER: url})
    deadline = time.monotonic() + 60
    while not (await chaos.dead()).get("orders"):
        assert time.monotonic() < deadline, "the poison message was not dead-lettered"
        await asyncio.sleep(0.2)
    await chaos.start("payments", "payments")
    await chaos.publish(ONE_ORDER.commands)
    result = await chaos.verify(tokens=1, dead={"orders": 1})
    assert len(result.dead_reasons["orders"]) == 1
    assert "retries exhausted" in result.dead_reasons["orders"][0]
    assert result.audit.received[("orders", str(poison))] == 3
    assert result.runs("orders", str(poison)) == 0
    later = {k: n for k, n in result.audit.handler_runs.items() if k[0] == "orders"}
    # the commands, the payment's follow-up and, once confirmed, the carrier's (protocol 12)
    shipments = {e["message_id"] for e in result.events("api.called", endpoint="orders")}
    assert len(later) == len(ONE_ORDER.commands) + 1 + len(shipments), later
    assert set(later.values()) == {1}, later


async def test_duplicate_republished_long_after_processing(chaos: Run) -> None:
    """Duplicates long after processing, their tokens gone: every command re-sent to the
    gateway (whose inbox row re-publishes the stored, byte-identical copy to orders) and
    the payment follow-up re-published to orders with its original ID, body and request URL.
    Left: nothing; the gateway's positive proof and orders' token check drop them. Asserted
    (after a first quiescence and its checks, then a second): no handler ran again anywhere,
    no new commit, every re-sent ID was dropped as a duplicate by orders, and the oracle and
    everything at rest still hold."""
    await chaos.seed(ONE_ORDER)
    await chaos.start("orders-a", "orders")
    await chaos.publish(ONE_ORDER.commands)
    first = await chaos.verify()
    [follow_up] = follow_ups(first)
    [url] = {e["key"] for e in first.events("side_effect.published", kind="http_delete")}
    [order_key] = ONE_ORDER.expected
    await chaos.publish(ONE_ORDER.commands)
    await chaos.redeliver("orders", Envelope(
        uuid.UUID(follow_up), "PaymentResult", encode(PaymentResult(order_key)),
        MappingProxyType({TOKEN_HEADER: "1", REQUEST_URL_HEADER: url})))
    # the IDs orders knows: the gateway's relays (fresh IDs of its committed attempts,
    # stored in its inbox rows) and the follow-up; the gateway knows the natural IDs
    relayed = {str(e["key"]) for e in first.events("side_effect.published", endpoint="gateway")}
    assert len(relayed) == K
    expected = {("orders", i) for i in [*relayed, follow_up]} | {
        ("gateway", str(c.message_id)) for c in ONE_ORDER.commands}

    async def dropped() -> bool:
        seen = {(str(r.get("endpoint")), str(r.get("message_id"))) for r in chaos.records()
                if r.get("event") == "message.duplicate"}
        return expected <= seen

    deadline = time.monotonic() + 60
    while not await dropped():
        assert time.monotonic() < deadline, "the late duplicates were not all dropped"
        await asyncio.sleep(0.25)
    second = await chaos.verify()
    assert second.audit.handler_runs == first.audit.handler_runs
    assert second.audit.commits == first.audit.commits
