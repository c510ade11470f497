"""The log audit of the chaos checks finds each invariant's violation and nothing on a clean
history (I1: one commit per message; I2: identical copies; I7: one publishing attempt)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.chaos.checks import audit_logs, read_logs


def ev(event: str, message: str = "m1", endpoint: str = "orders", **fields: Any
       ) -> dict[str, Any]:
    return {"event": event, "endpoint": endpoint, "message_id": message, **fields}


CLEAN = [
    ev("message.received", body_sha256="aa"), ev("handler.invoked", attempt_id="a1"),
    ev("message.received", body_sha256="aa"), ev("handler.invoked", attempt_id="a2"),
    ev("transaction.committed", attempt_id="a2"),
    ev("side_effect.published", attempt_id="a2", kind="message"),
    ev("side_effect.published", attempt_id="a2", kind="blob"),
    # another endpoint receiving a message with the same ID is not a second commit
    ev("message.received", endpoint="ledger", body_sha256="bb"),
    ev("transaction.committed", endpoint="ledger", attempt_id="a9"),
]


def test_a_clean_history_has_no_violation_and_counts_runs() -> None:
    audit = audit_logs(CLEAN)
    assert audit.violations == []
    assert audit.runs("orders", "m1") == 2
    assert audit.commits[("orders", "m1")] == 1
    assert audit.received[("orders", "m1")] == 2


def test_a_second_commit_of_one_message_is_i1() -> None:
    audit = audit_logs([*CLEAN, ev("transaction.committed", attempt_id="a3")])
    assert audit.violations == ["I1: orders committed m1 2 times"]


def test_copies_with_different_bodies_are_i2() -> None:
    audit = audit_logs([*CLEAN, ev("message.received", body_sha256="cc")])
    assert audit.violations == ["I2: orders received 2 different bodies for m1"]


def test_publications_from_two_attempts_are_i7() -> None:
    audit = audit_logs([*CLEAN, ev("side_effect.published", attempt_id="a1", kind="blob")])
    assert audit.violations == ["I7: orders published side effects of m1 from 2 attempts"]


def test_many_violations_are_listed_up_to_a_bound() -> None:
    doubled = [ev("transaction.committed", message=f"m{i}") for i in range(30) for _ in "xy"]
    violations = audit_logs(doubled).violations
    assert len(violations) == 11
    assert violations[-1] == "I1: ... 20 more"


def test_read_logs_skips_lines_cut_by_a_kill(tmp_path: Path) -> None:
    (tmp_path / "orders-0.1.jsonl").write_text(
        json.dumps(ev("handler.invoked")) + "\nTraceback (most recent call last):\n"
        + '{"event": "transaction.comm')
    (tmp_path / "orders-0.2.jsonl").write_text(json.dumps(ev("handler.invoked")) + "\n")
    assert audit_logs(read_logs(tmp_path)).runs("orders", "m1") == 2
