"""`eo embedded`'s runner (entrypoints/run_embedded.py) on the counters service: JSON lines
in the outside producers' format processed once, duplicates dropped, malformed messages
dead-lettered with the AMQP source's reasons, unroutable lines rejected, nothing at rest."""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from adapters.rabbitmq.dispatcher import envelope_of
from application.errors import MalformedMessage
from entrypoints.run_embedded import EmbeddedReport, run_embedded
from entrypoints.service_spec import resolve_service
from entrypoints.settings import load_settings
from tests.support.counters.registry import REGISTRY

A, B, C, D = (str(uuid.UUID(int=n)) for n in (1, 2, 3, 4))
NOTHING_AT_REST = {"tokens in flight": 0, "unfinished transaction records": 0,
                   "side-effect records": 0, "deferred clean-ups": 0, "requests on callees": 0,
                   "unrelayed inbox rows": 0}


def _line(queue: str, message_id: str | None, type_: str | None, body: Any) -> str:
    """One input line; a None field is left out."""
    raw = {"queue": queue, "message_id": message_id, "type": type_, "body": body}
    return json.dumps({k: v for k, v in raw.items() if v is not None})


def _add(queue: str, message_id: str, counter: str, amount: int) -> str:
    return _line(queue, message_id, "Add", {"counter": counter, "amount": amount})


async def _run(tmp_path: Path, lines: list[str], **settings: Any) -> EmbeddedReport:
    loaded = load_settings(blob_dir=tmp_path / "blobs", **settings)
    return await run_embedded(loaded, resolve_service(loaded, REGISTRY), lines)


def _settled(report: EmbeddedReport, name: str) -> dict[str, int]:
    """The non-zero settlements of endpoint `name`."""
    return {k: v for k, v in report.settled[name].items() if v}


async def test_lines_are_processed_once_duplicates_dropped_and_nothing_left_at_rest(
    tmp_path: Path,
) -> None:
    lines = [
        _add("front", A, "c1", 1),
        _add("front", B, "c1", 2),
        _add("front", A, "c1", 1),  # a copy: the gateway's processed-message row drops it
        "",  # blank lines are skipped
        _add("counter", C, "c2", 4),  # a token endpoint, fed as an upstream endpoint would
        _line("front", D, "Spend", {"counter": "c1", "amount": 8}),  # no account: refused
    ]
    report = await _run(tmp_path, lines)
    assert (report.lines, report.published, report.rejected) == (5, 5, [])
    assert _settled(report, "front") == {"processed": 3, "duplicate": 1}
    # the gateway re-published its stored copy of A's relay: the counter drops it by token
    assert _settled(report, "counter") == {"processed": 5, "duplicate": 1}  # + Spent
    assert _settled(report, "audit") == {"processed": 1}
    c1, c2 = report.states["counter"]["c1"], report.states["counter"]["c2"]
    assert (c1["total"], c1["refused"], c1["spent"]) == (3, [8], [])  # 1 + 2: each once
    assert (c2["total"], c2["applied"]) == (4, [C])
    assert report.states["front"] == {"c1": {"count": 3}}
    assert report.states["audit"]["c1"]["reports"] == [
        {"counter": "c1", "amount": 8, "status": 409, "total": 3}]
    assert report.dead_letters == {}
    assert report.at_rest == NOTHING_AT_REST


async def test_every_copy_the_endpoints_send_is_identical(tmp_path: Path) -> None:
    report = await _run(tmp_path, [_add("front", A, "c1", 1), _add("front", A, "c1", 1)])
    copies: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for out in report.outputs:
        copies[out["message_id"]].append(out)
    ((relayed, twice),) = copies.items()  # one message to the counter, sent twice
    assert relayed != A  # a new message ID: the gateway's output, with a token
    assert twice[0] == twice[1] == {"to": "counter", "message_id": relayed, "type": "Add",
                                    "body": {"counter": "c1", "amount": 1}}
    assert report.states["counter"]["c1"]["total"] == 1


async def test_receipts_are_blobs_in_the_blob_directory(tmp_path: Path) -> None:
    report = await _run(tmp_path, [_add("counter", C, "c2", 4), _add("front", A, "c1", 1)])
    receipts = [*report.states["counter"]["c1"]["receipts"],
                *report.states["counter"]["c2"]["receipts"]]
    assert sorted(receipts) == report.blobs
    assert len(receipts) == 2
    (c2_receipt,) = report.states["counter"]["c2"]["receipts"]
    assert (tmp_path / "blobs" / c2_receipt).read_bytes() == f"{C}:4".encode()


@dataclass
class _AmqpMessage:
    """What the AMQP source reads of a delivered message."""

    body: bytes
    message_id: str | None
    type: str | None
    headers: dict[str, Any] = field(default_factory=dict)
    user_id: str | None = None


def _amqp_reason(message: _AmqpMessage, max_body_bytes: int) -> str:
    """Why the AMQP source refuses `message` (adapters/rabbitmq/dispatcher.py)."""
    with pytest.raises(MalformedMessage) as caught:
        envelope_of(message, max_body_bytes)  # type: ignore[arg-type]
    return caught.value.reason


BODY = {"counter": "c1", "amount": 1}
LARGE = {"counter": "c" * 100, "amount": 1}


@pytest.mark.parametrize(
    ("message_id", "type_", "body", "reason"),
    [
        (None, "Add", BODY, "no message_id"),
        ("abc", "Add", BODY, "message_id 'abc' is not a UUID"),
        (A, None, BODY, "no type"),
        (A, "", BODY, "no type"),
        (A, "Add", LARGE, "body of 125 bytes exceeds the limit of 64"),
        ("", "Add", BODY, "no message_id"),
    ],
)
async def test_a_malformed_message_is_dead_lettered_with_the_amqp_sources_reason(
    tmp_path: Path, message_id: str | None, type_: str | None, body: Any, reason: str
) -> None:
    report = await _run(tmp_path, [_line("front", message_id, type_, body)],
                        max_body_bytes=64)
    raw = json.dumps(body, separators=(",", ":")).encode()
    assert _amqp_reason(_AmqpMessage(raw, message_id, type_), 64) == reason
    ((letter,),) = report.dead_letters.values()
    assert letter["reason"] == reason
    assert list(report.dead_letters) == ["front"]
    if message_id:
        assert letter["message_id"] == message_id  # as the line gave it
    assert report.published == 1
    # never processed, and counted as what it is: the count matches the list (issue 24:
    # "dead-lettered 1" while listing 2)
    assert _settled(report, "front") == {"dead_lettered": 1}
    assert all(not _settled(report, name) for name in report.settled if name != "front")
    assert report.at_rest == NOTHING_AT_REST


async def test_lines_that_are_no_message_or_go_to_no_work_queue_are_rejected(
    tmp_path: Path,
) -> None:
    lines = [
        _add("nope", A, "c1", 1),
        _line("bank", A, "Withdraw", {"account": "c1", "amount": 1}),  # a callee: no queue
        "not json",
        "[1, 2]",
        json.dumps({"message_id": A, "type": "Add", "body": BODY}),  # no queue
        _add("front", B, "c1", 2),
    ]
    report = await _run(tmp_path, lines)
    consumes = "(the service consumes ['audit', 'counter', 'front'])"
    assert [(r["line"], r["reason"]) for r in report.rejected] == [
        (1, f"unroutable: no queue 'nope' {consumes}"),
        (2, f"unroutable: no queue 'bank' {consumes}"),
        (3, "not a message: Expecting value: line 1 column 1 (char 0)"),
        (4, "not a message: not a JSON object"),
        (5, "not a message: 'queue'"),
    ]
    assert (report.lines, report.published) == (6, 1)
    assert report.states["counter"]["c1"]["total"] == 2  # the valid line still ran
    assert report.dead_letters == {}
    assert report.at_rest == NOTHING_AT_REST


async def test_a_late_copy_to_a_token_endpoint_is_dropped(tmp_path: Path) -> None:
    others = [_add("counter", str(uuid.UUID(int=100 + i)), f"other{i}", 1) for i in range(50)]
    report = await _run(tmp_path, [_add("counter", C, "c2", 4), *others,
                                   _add("counter", C, "c2", 4)])
    assert report.states["counter"]["c2"]["total"] == 4
    assert _settled(report, "counter") == {"processed": 51, "duplicate": 1}
