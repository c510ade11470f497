"""The log audit of the chaos checks finds each invariant's violation and nothing on a clean
history (I1: one commit per message; I2: identical copies, each with its digest; I3: output
of the committed attempt only; I7: one publishing attempt), refuses events it cannot
attribute, and the stores-at-rest queries count what is left (on a real PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from tests.support.processes import private_database, this_run
from tests.support.services import discover
from tools.chaos.at_rest import AT_REST, at_rest, kept_at_rest
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
    assert audit.violations == [  # a1 did not commit: its output is I3 too
        "I3: orders published side effects of m1 from attempt(s) ['a1'], not the committed "
        "['a2']",
        "I7: orders published side effects of m1 from 2 attempts"]


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


def test_a_copy_received_without_a_body_digest_is_i2() -> None:
    """A copy without a digest would pass the identical-copies check unseen."""
    audit = audit_logs([*CLEAN, ev("message.received")])
    assert audit.violations == ["I2: orders received m1 without a body digest"]


def test_an_event_without_an_endpoint_or_a_message_id_is_reported() -> None:
    audit = audit_logs([*CLEAN, {"event": "transaction.committed", "message_id": "m1",
                                 "attempt_id": "a7"},
                        {"event": "handler.invoked", "endpoint": "orders"}])
    assert [v.split(":")[:2] for v in audit.violations] == [
        ["unattributed", " transaction.committed without an endpoint"],
        ["unattributed", " handler.invoked without a message ID"]]
    # and an unattributed second commit is not silently merged into another endpoint's count
    assert audit.commits[("", "m1")] == 0


def test_a_publication_from_an_attempt_that_did_not_commit_is_i3() -> None:
    """All publications name one attempt (I7 holds), but not the committed one."""
    history = [ev("message.received", body_sha256="aa"), ev("handler.invoked", attempt_id="a1"),
               ev("transaction.committed", attempt_id="a1"),
               ev("side_effect.published", attempt_id="a0", kind="blob")]
    assert audit_logs(history).violations == [
        "I3: orders published side effects of m1 from attempt(s) ['a0'], not the committed "
        "['a1']"]


#: One row of each kind `AT_REST` must count, and beside it one it must not (a cleared TR, a
#: relayed inbox row, a token a dead letter keeps, a deferred clean-up within its grace).
_LEFT_OVER = [
    ("tokens in flight", "INSERT INTO eo_token VALUES ($1, 'Add', '', '{}', now(), 'counter')"),
    ("unfinished transaction records",
     "INSERT INTO eo_transaction_record VALUES ('counter', 'p', $1, $1, 2, now(), NULL)"),
    ("side-effect records", "INSERT INTO eo_side_effect_record VALUES ('counter', 'p', 'blob', "
     "'k', $1, $1, 0, '{}', now())"),
    ("deferred clean-ups past their grace", "INSERT INTO eo_deferred_cleanup (endpoint, "
     "kind, key, payload, due) SELECT 'counter', 'blob', 'k', '{}', now() WHERE $1::uuid "
     "IS NOT NULL"),
    ("requests on callees", "INSERT INTO eo_http_request VALUES ('bank', $1, 'Spend', '', "
     "'{}', false, now())"),
    ("unrelayed inbox rows", "INSERT INTO eo_inbox VALUES ('front', $1, 'Add', '', now(), "
     "NULL)"),
]
_KEPT_TOKEN = "00000000-0000-4000-8000-000000000001"
_NOT_LEFT_OVER = [
    "INSERT INTO eo_transaction_record VALUES ('counter', 'q', NULL, NULL, 4, NULL, NULL)",
    "INSERT INTO eo_inbox VALUES ('front', $1, 'Add', '', now(), now())",
    f"INSERT INTO eo_token VALUES ('{_KEPT_TOKEN}', 'Add', '', '{{}}', now(), 'counter')",
    "INSERT INTO eo_dead_letter (endpoint, message_id, body, replayable, reasons, first_at, "
    f"last_at) VALUES ('counter', '{_KEPT_TOKEN}', '', true, '[]', now(), now())",
    "INSERT INTO eo_deferred_cleanup (endpoint, kind, key, payload, due) VALUES "
    "('counter', 'blob', 'k2', '{}', now() + interval '1 hour')",
]


def test_the_stores_at_rest_checks_count_each_kind_of_left_over() -> None:
    """On a migrated database: nothing at rest on an empty one; a cleared TR, a relayed inbox
    row, the token a dead letter keeps and a deferred clean-up within its grace are not
    left-overs (the last two are counted as kept); each kind of left-over is counted under
    its name."""
    assert [name for name, _sql in _LEFT_OVER] == list(AT_REST)  # one probe per query

    kept: list[dict[str, int]] = []

    async def probe(dsn: str) -> list[dict[str, int]]:
        seen = []
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=1)
        try:
            seen.append(await at_rest(pool))
            for sql in _NOT_LEFT_OVER:
                await pool.execute(sql, *([uuid.uuid4()] if "$1" in sql else []))
            seen.append(await at_rest(pool))
            kept.append(await kept_at_rest(pool))
            for _name, sql in _LEFT_OVER:
                await pool.execute(sql, uuid.uuid4())
                seen.append(await at_rest(pool))
        finally:
            await pool.close()
        return seen

    services = discover(rabbitmq=False)
    try:
        with private_database(services.postgres_dsn, this_run("eo_at_rest")) as dsn:
            seen = asyncio.run(probe(dsn))
    finally:
        services.close()
    assert seen[0] == seen[1] == dict.fromkeys(AT_REST, 0)
    assert kept == [{"tokens kept by dead letters": 1,  # as `eo inspect` counts them apart
                     "deferred clean-ups within their grace": 1}]
    for i, (name, _sql) in enumerate(_LEFT_OVER):  # each insert moves its own count only
        assert {k: v for k, v in seen[i + 2].items() if v} == {
            n: 1 for n, _ in _LEFT_OVER[:i + 1]}, name
