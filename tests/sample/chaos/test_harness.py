"""The chaos harness's own rule (tests/sample/chaos/cluster.py `rerun_violations`): a handler run
beyond the committed attempt is allowed only after a visible abort. Checked on synthetic
log records, so the rule the chaos tests rely on is known to fail when it should."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.sample.chaos.cluster import CRASH_EXIT, Exit, ordering_violations, rerun_violations


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
    assert rerun_violations(crashed, [Exit("orders-a", CRASH_EXIT, log)]) == []


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
