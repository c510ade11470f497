"""The batched token path's statements (application/token_batch.py): one statement for many
partitions, each keeping the guard of its single statement."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from adapters.postgres.record_rows import array_literal, in_token_arrays, stored_rows
from adapters.postgres.sql.attempt import RECORDS_OF
from adapters.postgres.sql.writes import record_arrays
from application.codec import to_jsonable
from application.ports import Clear, CommitRequest

# Each partition keeps the guard of its single statement (sql/attempt.py, sql/writes.py); the
# transaction records a statement writes are locked first, in partition order, so concurrent
# batches cannot deadlock. Every row of a batch is found by its own index lookup (a LATERAL
# subquery with LIMIT 1 is not flattened into a join), whatever the planner's statistics: on a table
# without them (autovacuum off, or just truncated) a plain join of the request to the table
# is planned as a hash join over a sequential scan of every transaction record, which cost
# more than half of the batch's PostgreSQL time with 1,000 partitions and grows with the
# table (docs/bench.md). The writes then reach the locked rows by their ctid (a TID scan).

# the request rows (`req`) in partition order, each with the ctid of its TR locked FOR
# UPDATE; a partition without a TR has no row
_LOCKED = """
locked AS (
  SELECT l.tid, x.* FROM (SELECT * FROM req ORDER BY partition_key) AS x
  CROSS JOIN LATERAL (
    SELECT t.ctid AS tid FROM eo_transaction_record t
     WHERE t.endpoint = $1 AND t.partition_key = x.partition_key
     LIMIT 1 FOR UPDATE) AS l)"""

# the locked TRs (`t`), each joined to its request row (`req`); a TR updated by a
# transaction that committed while this statement waited for its lock is not in the
# statement's snapshot and is left alone, as its version guard would have refused it
_LOCKED_ROWS = """FROM locked AS req
   WHERE t.ctid = ANY (ARRAY(SELECT tid FROM locked)) AND t.ctid = req.tid"""

# request x's token (x.tok; NULL: none asked) addressed to endpoint $1, joined to its TR's
# read as LOAD's token is (sql/attempt.py): whether it exists and the message it holds
_TOKEN_COLUMNS_MANY = """CASE WHEN x.tok IS NULL THEN NULL ELSE k.message_id IS NOT NULL END
       AS token_exists, k.type AS token_type, k.body AS token_body, k.headers AS token_headers"""
_TOKEN_JOIN_MANY = """LEFT JOIN LATERAL (
    SELECT * FROM eo_token k
     WHERE k.message_id = x.tok AND (k.endpoint = $1 OR k.endpoint IS NULL) LIMIT 1) AS k
    ON TRUE"""

# $1 endpoint, $2 partitions, $3 tokens to check (NULL: none). A row per partition;
# `tr_exists` false for one without a TR: INSERT_LOAD_MANY creates and reads those whose token
# is not absent.
LOAD_MANY = f"""
SELECT x.partition_key, t.partition_key IS NOT NULL AS tr_exists, t.message_id, t.attempt_id,
       t.version, t.committed_at, t.state, {_TOKEN_COLUMNS_MANY}
  FROM unnest($2::text[], $3::uuid[]) AS x(partition_key, tok)
  LEFT JOIN LATERAL (
    SELECT * FROM eo_transaction_record t
     WHERE t.endpoint = $1 AND t.partition_key = x.partition_key LIMIT 1) AS t ON TRUE
  {_TOKEN_JOIN_MANY}"""

# LOAD_MANY's partitions without a TR: create and read them in one statement. A partition a
# concurrent statement created first is missing from the result (its row is not in this
# statement's snapshot): LOAD_MANY reads it again.
INSERT_LOAD_MANY = f"""
WITH req AS (
  SELECT * FROM unnest($2::text[], $3::uuid[]) AS x(partition_key, tok)),
ins AS (
  INSERT INTO eo_transaction_record (endpoint, partition_key)
  SELECT $1, partition_key FROM req ORDER BY partition_key
  ON CONFLICT DO NOTHING
  RETURNING partition_key, message_id, attempt_id, version, committed_at, state)
SELECT x.partition_key, TRUE AS tr_exists, i.message_id, i.attempt_id, i.version,
       i.committed_at, i.state, {_TOKEN_COLUMNS_MANY}
  FROM req x JOIN ins i USING (partition_key)
  {_TOKEN_JOIN_MANY}"""

# $1 endpoint, $2-$6 per partition: partition, expected version, state, message, attempt;
# $7 now; $8-$15 records (partition first); $16-$21 tokens (partition first); $22-$23 per
# partition, the IDs and seqs of the messages whose tokens stand for their records (array
# literals: a statement's parameters cannot be arrays of arrays). Every insert joins the
# partitions whose guarded TR update matched (tr).
COMMIT_MANY = f"""
WITH req AS (
  SELECT * FROM unnest($2::text[], $3::bigint[], $4::jsonb[], $5::uuid[], $6::uuid[],
                       $22::text[], $23::text[])
    AS x(partition_key, expected, state, message_id, attempt_id, in_ids, in_seqs)),
{_LOCKED},
tr AS (
  UPDATE eo_transaction_record t
     SET state = req.state, message_id = req.message_id, attempt_id = req.attempt_id,
         committed_at = $7, version = t.version + 1, in_token_ids = req.in_ids::uuid[],
         in_token_seqs = req.in_seqs::int[]
    {_LOCKED_ROWS}
     AND t.version = req.expected AND t.message_id IS NULL
  RETURNING t.partition_key, t.version),
recs AS (
  INSERT INTO eo_side_effect_record
    (endpoint, partition_key, kind, key, incoming_id, attempt_id, seq, payload, registered_at)
  SELECT $1, x.p, x.k, x.ky, x.i, x.a, x.s, x.pl, x.at
    FROM unnest($8::text[], $9::text[], $10::text[], $11::uuid[], $12::uuid[], $13::int[],
                $14::jsonb[], $15::timestamptz[]) AS x(p, k, ky, i, a, s, pl, at)
    JOIN tr ON tr.partition_key = x.p),
toks AS (
  INSERT INTO eo_token (endpoint, message_id, type, body, headers)
  SELECT x.d, x.m, x.ty, x.b, x.h
    FROM unnest($16::text[], $17::text[], $18::uuid[], $19::text[], $20::bytea[],
                $21::jsonb[]) AS x(p, d, m, ty, b, h)
    JOIN tr ON tr.partition_key = x.p
  ON CONFLICT (message_id) DO NOTHING)
SELECT tr.partition_key, tr.version,
       {RECORDS_OF.format(extra="").replace("t.endpoint", "$1")
                   .replace("t.partition_key", "tr.partition_key")} AS records
  FROM tr"""



def commit_many_arguments(endpoint: str, requests: Sequence[CommitRequest], now: datetime
                          ) -> list[Any]:
    """COMMIT_MANY's parameters ($1-$23) committing `requests` of `endpoint` at `now`."""
    records = [x for r in requests for x in stored_rows(r.records)]
    tokens = [(r.partition, d, e) for r in requests for d, e in r.tokens]
    held = [in_token_arrays(r.records) for r in requests]
    return [endpoint, [r.partition for r in requests], [r.expected_version for r in requests],
            [to_jsonable(r.state) for r in requests], [r.message_id for r in requests],
            [r.attempt_id for r in requests], now,
            [x.partition for x in records], *record_arrays(records, now),
            [p for p, _, _ in tokens], [d for _, d, _ in tokens],
            [e.message_id for _, _, e in tokens], [e.type for _, _, e in tokens],
            [e.body for _, _, e in tokens], [dict(e.headers) for _, _, e in tokens],
            [array_literal(ids) for ids, _ in held],
            [array_literal(map(str, seqs)) for _, seqs in held]]


# $1 endpoint, $2-$4 per partition: partition, expected version, token to consume (NULL:
# none); $5-$7 records to delete (partition, kind, key); $8-$12 aborted records to list for
# deferred clean-up (partition, kind, key, payload, due).
CLEAR_MANY = f"""
WITH req AS (
  SELECT * FROM unnest($2::text[], $3::bigint[], $4::uuid[])
    AS x(partition_key, expected, consume)),
{_LOCKED},
tr AS (
  UPDATE eo_transaction_record t
     SET message_id = NULL, attempt_id = NULL, committed_at = NULL, version = t.version + 1,
         in_token_ids = NULL, in_token_seqs = NULL
    {_LOCKED_ROWS}
     AND t.version = req.expected
  RETURNING t.partition_key, req.consume),
del AS (
  DELETE FROM eo_side_effect_record r
   USING tr, unnest($5::text[], $6::text[], $7::text[]) AS x(p, k, ky)
   WHERE r.endpoint = $1 AND tr.partition_key = x.p AND r.partition_key = x.p
     AND r.kind = x.k AND r.key = x.ky),
def AS (
  INSERT INTO eo_deferred_cleanup (endpoint, kind, key, payload, due)
  SELECT $1, x.k, x.ky, x.pl, x.due
    FROM unnest($8::text[], $9::text[], $10::text[], $11::jsonb[], $12::timestamptz[])
      AS x(p, k, ky, pl, due)
    JOIN tr ON tr.partition_key = x.p),
tok AS (
  DELETE FROM eo_token k USING tr
   WHERE k.message_id = tr.consume AND (k.endpoint = $1 OR k.endpoint IS NULL))
SELECT partition_key FROM tr"""


def clear_many_arguments(endpoint: str, clears: Sequence[Clear]) -> list[Any]:
    """CLEAR_MANY's parameters ($1-$12) clearing `clears` of `endpoint`."""
    records = [(c.partition, x) for c in clears for x in stored_rows(c.records)]
    aborted = [(c.partition, c.cleanup_due, x) for c in clears for x in c.aborted]
    return [endpoint, [c.partition for c in clears], [c.expected_version for c in clears],
            [c.consume for c in clears],
            [p for p, _ in records], [str(x.kind) for _, x in records],
            [x.key for _, x in records],
            [p for p, _, _ in aborted], [str(x.kind) for _, _, x in aborted],
            [x.key for _, _, x in aborted], [dict(x.payload) for _, _, x in aborted],
            [due for _, due, _ in aborted]]
