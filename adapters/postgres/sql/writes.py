"""The single path's writes, commit and clear, each one statement guarded by the transaction
record's version: the full ones and those of the plain co-located case."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from adapters.postgres.sql.attempt import RECORDS_OF
from application.records import SideEffectRecord

# The co-located single path's commit and clear, built from their parts: the full statements
# (COMMIT, CLEAR) and those of the plain case (COMMIT_TOKENS, CLEAR_CONSUMING), which set up
# no modifying CTE that would write nothing: 12 % less PostgreSQL CPU per message on the
# single path (docs/bench.md). The plain ones keep the full ones' guards.


def _commit_tr(in_ids: str, in_seqs: str, guard: str = "") -> str:
    """A commit's TR update: state, message, attempt, time and the IDs and seqs of the
    messages whose tokens stand for their records (`in_ids`, `in_seqs`), on the TR idle at
    the expected version (and `guard`)."""
    return f"""tr AS (
  UPDATE eo_transaction_record
     SET state = $4, message_id = $5, attempt_id = $6, committed_at = $7, version = version + 1,
         in_token_ids = {in_ids}, in_token_seqs = {in_seqs}
   WHERE endpoint = $1 AND partition_key = $2 AND version = $3 AND message_id IS NULL{guard}
  RETURNING version)"""


def _insert_tokens(first: int) -> str:
    """The outgoing tokens of a commit whose TR update matched, columns $first..$first+4
    (destination, message ID, type, body, headers)."""
    d, m, ty, b, h = (f"${n}" for n in range(first, first + 5))
    return f"""toks AS (
  INSERT INTO eo_token (endpoint, message_id, type, body, headers)
  SELECT d, m, ty, b, h
    FROM tr, unnest({d}::text[], {m}::uuid[], {ty}::text[], {b}::bytea[], {h}::jsonb[])
      AS x(d, m, ty, b, h)
  ON CONFLICT (message_id) DO NOTHING)"""


_COMMITTED = f"""
SELECT tr.version, {RECORDS_OF.format(extra="").replace("t.endpoint", "$1")
                                   .replace("t.partition_key", "$2")} AS records
  FROM tr"""

# $1 endpoint, $2 partition, $3 expected version, $4 state, $5 message, $6 attempt, $7 now,
# $8 with processed-message row, $9-$15 record columns, $16 reply status, $17 reply body,
# $18 outgoing, $19-$23 token columns, $24 the processed body's SHA-256, $25-$26 the IDs and
# seqs of the messages whose tokens stand for their records, $27 the producer, $28 the
# message's digest (type and body). One statement: the TR update
# guards every insert (FROM tr). The processed-message row is the claim of the message ID
# (protocol 4): `_NOT_PROCESSED` sees the rows committed before the statement began, and a
# concurrent commit of the same ID on another partition (another body) meets the primary key,
# whose violation (`PROCESSED_KEY`) rolls the whole statement back. `ON CONFLICT DO NOTHING`
# there would commit both partitions (test_postgres_protocol.py's same-ID pairs).
#: the constraint a second claim of one message ID violates
PROCESSED_KEY = "eo_processed_message_pkey"
_NOT_PROCESSED = """
     AND NOT ($8::boolean AND EXISTS (
       SELECT 1 FROM eo_processed_message
        WHERE endpoint = $1 AND producer = $27 AND message_id = $5))"""
COMMIT = f"""
WITH {_commit_tr("$25", "$26", _NOT_PROCESSED)},
recs AS (
  INSERT INTO eo_side_effect_record
    (endpoint, partition_key, kind, key, incoming_id, attempt_id, seq, payload, registered_at)
  SELECT $1, $2, k, ky, i, a, s, p, at
    FROM tr, unnest($9::text[], $10::text[], $11::uuid[], $12::uuid[], $13::int[],
                    $14::jsonb[], $15::timestamptz[]) AS x(k, ky, i, a, s, p, at)),
reply AS (
  INSERT INTO eo_stored_reply (endpoint, message_id, status, body)
  SELECT $1, $5, $16, $17 FROM tr WHERE $16::int IS NOT NULL
  ON CONFLICT (endpoint, message_id) DO NOTHING),
processed AS (
  INSERT INTO eo_processed_message
    (endpoint, message_id, partition_key, outgoing, processed_at, body_sha256, producer, digest)
  SELECT $1, $5, $2, to_jsonb($18::jsonb[]), $7, $24, $27, $28 FROM tr WHERE $8),
{_insert_tokens(19)}{_COMMITTED}"""

# COMMIT of the plain case: no record row, reply or processed-message row, only the TR and
# the outgoing tokens. $1-$7 as COMMIT; $8-$12 token columns; $13-$14 the IDs and seqs of
# the messages whose tokens stand for their records.
COMMIT_TOKENS = f"""
WITH {_commit_tr("$13", "$14")},
{_insert_tokens(8)}{_COMMITTED}"""


def record_arrays(records: Sequence[SideEffectRecord], now: datetime) -> list[list[Any]]:
    """The record column arrays of `COMMIT` ($9-$15)."""
    return [[str(r.kind) for r in records], [r.key for r in records],
            [r.incoming_id for r in records], [r.attempt_id for r in records],
            [r.seq for r in records], [dict(r.payload) for r in records],
            [r.registered_at or now for r in records]]


# a clear's TR update (compare-and-clear on $3), and its consumption of token `param`
_CLEAR_TR = """tr AS (
  UPDATE eo_transaction_record
     SET message_id = NULL, attempt_id = NULL, committed_at = NULL, version = version + 1,
         in_token_ids = NULL, in_token_seqs = NULL
   WHERE endpoint = $1 AND partition_key = $2 AND version = $3
  RETURNING 1)"""


def _consume(param: str) -> str:
    return f"""tok AS (
  DELETE FROM eo_token USING tr
   WHERE message_id = {param}::uuid AND (endpoint = $1 OR endpoint IS NULL))
SELECT count(*) FROM tr"""


def losers_cleaned(listed: tuple[str, str, str], due: str) -> str:
    """The CTEs of a guarded TR update (`tr`) that delete the partition's records $4 (kinds)
    and $5 (keys) and list the records `listed` (the parameters of their kinds, keys and
    payloads) for deferred clean-up at `due`: what a clear and a take-over both do."""
    kinds, keys, payloads = listed
    return f"""del AS (
  DELETE FROM eo_side_effect_record r USING tr
   WHERE r.endpoint = $1 AND r.partition_key = $2
     AND (r.kind, r.key) IN (SELECT * FROM unnest($4::text[], $5::text[]))),
def AS (
  INSERT INTO eo_deferred_cleanup (endpoint, kind, key, payload, due)
  SELECT $1, k, ky, p, {due} FROM tr, unnest({kinds}::text[], {keys}::text[], {payloads}::jsonb[]) AS x(k, ky, p))"""  # noqa: E501 - the statement's own line


CLEAR = f"""
WITH {_CLEAR_TR},
{losers_cleaned(("$6", "$7", "$8"), "$9")},
{_consume("$10")}"""

# CLEAR of the plain case: no record row to delete, no loser to list. $1-$3 as CLEAR, $4 the
# token to consume.
CLEAR_CONSUMING = f"""
WITH {_CLEAR_TR},
{_consume("$4")}"""
