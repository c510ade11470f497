"""Dead letters as operators see them, shared by `eo dead-letters` and its HTTP API: a dead
letter and an action's outcome as JSON, and a `DeadLetterQuery` from an operator's filters,
within the limits both take. Light to import: no web framework."""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from application.dead_letters import ActionResult
from application.ports import DeadLetterQuery
from application.records import DeadLetter, DeadLetterStatus

#: the most dead letters one request lists or acts on
MAX_LIMIT = 1000
#: the largest dead-letter ID: IDs are PostgreSQL `bigserial`s, 1..2**63 - 1
MAX_DEAD_LETTER_ID = 2**63 - 1
#: the longest age a filter takes, in seconds: 100 years (36,525 days)
MAX_AGE_S = 36_525 * 86_400


def letter_json(letter: DeadLetter, token_exists: bool | None = None) -> dict[str, Any]:
    """`letter` as JSON: its identity, where it came from, why (the reason history), what
    operators did, and the message itself (the body as JSON when it is, else base64), with
    `originals`: the bytes (base64) of each text that had to be kept escaped (U+0000, bytes
    that were not UTF-8: `DeadLetter.originals`), by field."""
    try:
        body: Any = json.loads(letter.body)
        encoding = "json"
    except ValueError:
        body, encoding = base64.b64encode(letter.body).decode(), "base64"
    return {
        "dead_letter_id": letter.dead_letter_id, "endpoint": letter.endpoint,
        "status": str(letter.status), "message_id": str(letter.message_id or "") or None,
        "raw_message_id": letter.raw_message_id, "type": letter.type,
        "producer": letter.producer or None, "origin_id": letter.origin_id,
        "origin_producer": letter.origin_producer, "replayable": letter.replayable,
        "first_at": letter.first_at.isoformat(), "last_at": letter.last_at.isoformat(),
        "age_s": round((datetime.now(UTC) - letter.last_at).total_seconds(), 1),
        "reasons": [{"at": r.at.isoformat(), "reason": r.reason, "attempt": r.attempt}
                    for r in letter.reasons],
        "replays": letter.replays, "acted_at": letter.acted_at.isoformat()
        if letter.acted_at else None, "acted_by": letter.acted_by,
        "discard_reason": letter.discard_reason, "token_exists": token_exists,
        "headers": dict(letter.headers), "body": body, "body_encoding": encoding,
        "originals": {name: base64.b64encode(raw).decode()
                      for name, raw in letter.originals.items()},
    }


def result_json(result: ActionResult) -> dict[str, Any]:
    """An action's outcome as JSON."""
    return {"dead_letter_id": result.dead_letter_id, "done": result.done,
            "detail": result.detail}


def age(seconds: float | None, name: str = "an age") -> timedelta | None:
    """`seconds` as a timedelta (None for None). Raises ValueError naming `name` and the
    limit unless it is a finite number from 0 to `MAX_AGE_S` (100 years)."""
    if seconds is None:
        return None
    if not (math.isfinite(seconds) and 0 <= seconds <= MAX_AGE_S):
        raise ValueError(f"{name} must be 0 to {MAX_AGE_S} seconds (100 years)")
    return timedelta(seconds=seconds)


def query_of(endpoints: list[str] | None = None, ids: list[int] | None = None,
             status: str | None = "dead", reason: str | None = None,
             older_than: timedelta | None = None, newer_than: timedelta | None = None,
             limit: int = 100, now: datetime | None = None) -> DeadLetterQuery:
    """A `DeadLetterQuery` from an operator's filters: `status` one of dead, replayed,
    discarded or any; ages relative to `now` (default: the wall clock). Raises ValueError
    for an unknown status, a limit outside 1..`MAX_LIMIT`, an ID outside
    1..`MAX_DEAD_LETTER_ID`, or an age below 0 or over `MAX_AGE_S` seconds (100 years)."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be 1..{MAX_LIMIT}")
    if status not in (None, "any", *(str(s) for s in DeadLetterStatus)):
        raise ValueError(f"status must be dead, replayed, discarded or any, not {status!r}")
    if not all(1 <= i <= MAX_DEAD_LETTER_ID for i in ids or ()):
        raise ValueError(f"dead-letter IDs must be 1..{MAX_DEAD_LETTER_ID}")
    for name, bound in (("older_than", older_than), ("newer_than", newer_than)):
        if bound is not None and not timedelta(0) <= bound <= timedelta(seconds=MAX_AGE_S):
            raise ValueError(f"{name} must be 0 to {MAX_AGE_S} seconds (100 years)")
    now = now or datetime.now(UTC)
    return DeadLetterQuery(
        tuple(endpoints or ()), tuple(ids or ()),
        None if status in (None, "any") else DeadLetterStatus(status), reason or None,
        None if older_than is None else now - older_than,
        None if newer_than is None else now - newer_than, limit)
