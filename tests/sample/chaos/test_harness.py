"""The chaos harness's own rules (`tools.chaos.checks.rerun_violations`, the ordering checks
of tests/sample/chaos/cluster.py): a handler run beyond the committed attempt is allowed
only after a visible abort, and only a planned death excuses one (its attempt in progress).
Checked on synthetic log records, so the rules the chaos tests rely on are known to fail
when they should."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.sample.chaos.cluster import CRASH_EXIT, Exit, ordering_violations
from tools.chaos.checks import open_attempts, rerun_violations


def _event(event: str, attempt: str, message: str = "m1", **fields: Any) -> dict[str, Any]:
    return {"event": event, "endpoint": "orders", "message_id": message,
            "attempt_id": attempt, **fields}


def test_a_second_run_without_an_abort_is_a_violation() -> None:
    records = [_event("handler.invoked", "a1"), _event("transaction.committed", "a1"),
               _event("handler.invoked", "a2")]
    assert rerun_violations(records, []) != []


def test_two_committed_attempts_are_a_violation() -> None:
    records = [_event("handler.invoked", "a1"), _event("transaction.committed", "a1"),
               _event("handler.invoked", "a2"), _event("transaction.committed", "a2"),
               _event("transaction.conflict", "")]
    assert rerun_violations(records, []) != []


def test_runs_after_a_conflict_a_retry_or_a_crash_are_allowed(tmp_path: Path) -> None:
    conflict = [_event("handler.invoked", "a1"), _event("transaction.conflict", ""),
                _event("handler.invoked", "a2"), _event("transaction.committed", "a2")]
    retried = [_event("handler.invoked", "a1"), _event("message.retried", ""),
               _event("handler.invoked", "a2"), _event("transaction.committed", "a2")]
    assert rerun_violations(conflict, []) == []
    assert rerun_violations(retried, []) == []
    log = tmp_path / "orders-a.1.jsonl"
    log.write_text('{"event": "handler.invoked", "endpoint": "orders", "message_id": "m1", '
                   '"attempt_id": "a1"}\nfailpoint before_commit: crash\n')
    crashed = [_event("handler.invoked", "a1"), _event("handler.invoked", "a2"),
               _event("transaction.committed", "a2")]
    assert rerun_violations(crashed, []) != []
    death = Exit("orders-a", CRASH_EXIT, log)
    assert death.planned
    assert rerun_violations(crashed, [death.events()]) == []


def test_an_exit_nobody_planned_excuses_no_re_run(tmp_path: Path) -> None:
    """A process that died by its own failure (exit 1, or exit 70 without a failpoint's
    line) is no planned death: the harness does not pass it, and the re-run is reported."""
    log = tmp_path / "orders-a.1.jsonl"
    log.write_text('{"event": "handler.invoked", "endpoint": "orders", "message_id": "m1", '
                   '"attempt_id": "a1"}\nTraceback (most recent call last):\n')
    assert not Exit("orders-a", 1, log).planned
    assert not Exit("orders-a", CRASH_EXIT, log).planned
    crashed = [_event("handler.invoked", "a1"), _event("handler.invoked", "a2"),
               _event("transaction.committed", "a2")]
    assert rerun_violations(crashed, []) != []


def test_a_planned_death_excuses_only_the_attempts_in_progress() -> None:
    """The dying process ran m1's handler, saw that attempt retried, then ran m2's and
    m3's (a batch: both in progress) and died: m2's and m3's second runs are excused, while
    m1's third run still needs an abort of its own."""
    dying = [_event("handler.invoked", "a1"), _event("message.retried", ""),
             _event("handler.invoked", "b1", message="m2"),
             _event("handler.invoked", "c1", message="m3")]
    records = [*dying,
               _event("handler.invoked", "a2"), _event("handler.invoked", "a3"),
               _event("transaction.committed", "a3"),
               *(e for m, a in (("m2", "b2"), ("m3", "c2"))
                 for e in (_event("handler.invoked", a, message=m),
                           _event("transaction.committed", a, message=m)))]
    assert rerun_violations(records, [dying]) == [
        "('orders', 'm1'): 3 handler runs, 1 committed, only 1 visible aborts (conflict, "
        "retry, planned death)"]


def test_a_settlement_ends_one_of_two_copies_in_progress_and_a_death_the_other() -> None:
    """Two copies of m1 run at once in one process (a duplicate beside its original), both
    rejected; one dead letter could not be published (a paused node) and the process is
    killed during the other's: both runs ended visibly, the third (its redelivery,
    dead-lettered) is allowed (eo chaos --production seed 47 run 15 on the fixture service
    reported it: a settlement took every open attempt of the message with it)."""
    dying = [_event("handler.invoked", "a1"), _event("handler.invoked", "a2"),
             _event("message.settlement_failed", "", settlement="dead_letter")]
    records = [*dying, _event("handler.invoked", "a3"), _event("message.dead_lettered", "")]
    assert open_attempts(dying) == [(("orders", "m1"), "a2")]
    assert rerun_violations(records, [dying]) == []
    assert rerun_violations(records, []) != []  # without the death, one run is unexplained


def test_an_abandoned_batch_attempt_excuses_the_run_of_its_message_alone() -> None:
    batch = [_event("handler.invoked", "a1"), _event("attempt.abandoned", "a1"),
             _event("handler.invoked", "a2"), _event("transaction.committed", "a2")]
    assert rerun_violations(batch, []) == []
    assert open_attempts(batch) == []
    silent = [_event("handler.invoked", "a1"),  # left without a word: not excused
              _event("handler.invoked", "a2"), _event("transaction.committed", "a2")]
    assert rerun_violations(silent, []) != []
    assert open_attempts(silent) == [(("orders", "m1"), "a1")]


def test_a_publication_before_the_commit_or_after_the_consume_is_a_violation() -> None:
    def at(second: int, record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "timestamp": f"2026-01-01T00:00:{second:02d}.000001Z"}

    commit = at(1, _event("transaction.committed", "a1"))
    publish = at(2, _event("side_effect.published", "a1", kind="message", key="k1"))
    consume = at(3, _event("token.consumed", "a1"))
    assert ordering_violations([commit, publish, consume]) == []
    assert ordering_violations([publish, at(3, commit), consume]) != []  # I4: ghost output
    assert ordering_violations([commit, at(4, publish), consume]) != []  # I6: consumed first
    # a stale finisher may publish again after the consume: allowed
    assert ordering_violations([commit, publish, consume, at(5, publish)]) == []


def test_the_audit_counts_the_runs_a_batch_abandoned_apart() -> None:
    from tools.chaos.checks import audit_logs

    records = [_event("message.received", "", body_sha256="ab"),
               _event("handler.invoked", "a1"), _event("attempt.abandoned", "a1"),
               _event("handler.invoked", "a2"), _event("transaction.committed", "a2")]
    audit = audit_logs(records)
    assert audit.runs("orders", "m1") == 1  # the run that counted
    assert audit.abandoned[("orders", "m1")] == 1


def test_a_retry_that_could_not_be_published_is_an_abort_and_a_lost_ack_is_not() -> None:
    # the attempt failed, its retry copy could not be published (the connection went
    # away): the broker redelivers the message, and its next run is allowed
    def runs(settlement: str) -> list[dict[str, Any]]:
        return [_event("handler.invoked", "a1"),
                _event("message.settlement_failed", "", settlement=settlement),
                _event("handler.invoked", "a2"), _event("transaction.committed", "a2")]

    assert rerun_violations(runs("retry"), []) == []
    assert rerun_violations(runs("dead_letter"), []) == []
    assert rerun_violations(runs("ack"), []) != []  # an ack lost after a commit excuses nothing
