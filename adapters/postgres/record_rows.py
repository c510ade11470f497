"""Rows of the transactional store's tables turned into records and back: the transaction
record and side-effect records a statement reads, and the columns a commit writes."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Sequence
from datetime import datetime
from types import MappingProxyType
from typing import Any

from application.envelope import Envelope
from application.records import Kind, SideEffectRecord, TransactionRecord
from application.side_effects import message_payload


def transaction_record(partition: str, row: Any) -> TransactionRecord:
    return TransactionRecord(partition, row["message_id"], row["attempt_id"], row["version"],
                             row["committed_at"])


def array_literal(items: Any) -> str | None:
    """A PostgreSQL array literal of plain items (UUIDs, integers), None when empty."""
    text = ",".join(items)
    return f"{{{text}}}" if text else None


def side_effect_record(partition: str, r: dict[str, Any]) -> SideEffectRecord:
    return SideEffectRecord(partition, Kind(r["kind"]), r["key"], uuid.UUID(r["incoming_id"]),
                            uuid.UUID(r["attempt_id"]), r["seq"], r["payload"],
                            datetime.fromisoformat(r["registered_at"]))


def in_token_record(tr: TransactionRecord, t: dict[str, Any]) -> SideEffectRecord:
    """The record a committed transaction's outgoing token stands for (an item of the
    `in_tokens` of `SELECT_TR_WITH_RECORDS`, sql/attempt.py)."""
    if tr.message_id is None or tr.attempt_id is None:
        raise ValueError(f"partition {tr.partition}: no committed transaction")
    envelope = Envelope(uuid.UUID(t["message_id"]), t["type"], base64.b64decode(t["body"]),
                        MappingProxyType(t["headers"]))
    return SideEffectRecord(tr.partition, Kind.MESSAGE, t["message_id"], tr.message_id,
                            tr.attempt_id, t["seq"], message_payload(t["destination"], envelope),
                            tr.committed_at, in_token=True)


def in_token_arrays(records: Sequence[SideEffectRecord]) -> tuple[list[str], list[int]]:
    """The IDs and seqs of the records that tokens stand for (the commits' last columns)."""
    held = [x for x in records if x.in_token]
    return [x.key for x in held], [x.seq for x in held]


def stored_rows(records: Sequence[SideEffectRecord]) -> list[SideEffectRecord]:
    """The records a statement writes or deletes as rows: not those tokens stand for."""
    return [x for x in records if not x.in_token]
