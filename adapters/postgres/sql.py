"""The SQL of the PostgreSQL transactional store; every optimistic write is one statement.

Data-modifying CTEs run in one snapshot and all-or-nothing: `FROM tr` makes the dependent
writes happen only when the guarded update of the transaction record matched.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from application.records import SideEffectRecord

SELECT_TR = """
SELECT message_id, attempt_id, version, committed_at FROM eo_transaction_record
 WHERE endpoint = $1 AND partition_key = $2"""

INSERT_TR = """
WITH ins AS (
  INSERT INTO eo_transaction_record (endpoint, partition_key) VALUES ($1, $2)
  ON CONFLICT DO NOTHING
  RETURNING message_id, attempt_id, version, committed_at)
SELECT * FROM ins
UNION ALL
SELECT message_id, attempt_id, version, committed_at FROM eo_transaction_record
 WHERE endpoint = $1 AND partition_key = $2
LIMIT 1"""

_RECORDS_OF = """
coalesce((SELECT jsonb_agg(jsonb_build_object(
    'kind', r.kind, 'key', r.key, 'incoming_id', r.incoming_id, 'attempt_id', r.attempt_id,
    'seq', r.seq, 'payload', r.payload, 'registered_at', r.registered_at) ORDER BY r.seq)
  FROM eo_side_effect_record r
  WHERE r.endpoint = t.endpoint AND r.partition_key = t.partition_key {extra}), '[]'::jsonb)"""

# the committed transaction's messages whose tokens stand for their records
# (`SideEffectRecord.in_token`), of those tokens still there, in `seq` order
_IN_TOKENS_OF = """
coalesce((SELECT jsonb_agg(jsonb_build_object(
    'message_id', o.message_id, 'seq', o.seq, 'destination', k.endpoint, 'type', k.type,
    'body', encode(k.body, 'base64'), 'headers', k.headers) ORDER BY o.seq)
  FROM unnest(t.in_token_ids, t.in_token_seqs) AS o(message_id, seq)
  JOIN eo_token k ON k.message_id = o.message_id
  WHERE t.message_id IS NOT NULL), '[]'::jsonb)"""

SELECT_TR_WITH_RECORDS = f"""
SELECT t.message_id, t.attempt_id, t.version, t.committed_at,
       {_RECORDS_OF.format(extra="")} AS records, {_IN_TOKENS_OF} AS in_tokens
  FROM eo_transaction_record t WHERE t.endpoint = $1 AND t.partition_key = $2"""

# the token's row joined to the TR's read ($3 NULL: no token asked, every token column NULL):
# whether the token addressed to this endpoint ($1, or written before tokens had an address)
# exists, and the message it holds (claim check), in the TR's snapshot
_TOKEN_COLUMNS = """CASE WHEN $3::uuid IS NULL THEN NULL ELSE k.message_id IS NOT NULL END
       AS token_exists, k.type AS token_type, k.body AS token_body, k.headers AS token_headers"""
_TOKEN_JOIN = """LEFT JOIN eo_token k
    ON k.message_id = $3 AND (k.endpoint = $1 OR k.endpoint IS NULL)"""

# one row always: `tr_exists` false when the partition has no TR yet
LOAD = f"""
SELECT t.message_id, t.attempt_id, t.version, t.committed_at, t.state,
       t.partition_key IS NOT NULL AS tr_exists, {_TOKEN_COLUMNS}
  FROM (SELECT) AS one
  LEFT JOIN eo_transaction_record t ON t.endpoint = $1 AND t.partition_key = $2
  {_TOKEN_JOIN}"""

INSERT_LOAD = f"""
WITH ins AS (
  INSERT INTO eo_transaction_record (endpoint, partition_key) VALUES ($1, $2)
  ON CONFLICT DO NOTHING
  RETURNING message_id, attempt_id, version, committed_at, state)
SELECT x.*, {_TOKEN_COLUMNS} FROM (
  SELECT * FROM ins
  UNION ALL
  SELECT message_id, attempt_id, version, committed_at, state FROM eo_transaction_record
   WHERE endpoint = $1 AND partition_key = $2
  LIMIT 1) AS x {_TOKEN_JOIN}"""

REGISTER = """
WITH bump AS (
  UPDATE eo_transaction_record SET version = version + 1
   WHERE endpoint = $1 AND partition_key = $2 AND version = $3 AND message_id IS NULL
  RETURNING version),
ins AS (
  INSERT INTO eo_side_effect_record
    (endpoint, partition_key, kind, key, incoming_id, attempt_id, seq, payload, registered_at)
  SELECT $1, $2, $4, $5, $6, $7, $8, $9, $10 FROM bump)
SELECT version FROM bump"""

REGISTRATION_VALID = """
SELECT t.message_id IS NULL AND EXISTS (
  SELECT 1 FROM eo_side_effect_record r
   WHERE r.endpoint = $1 AND r.kind = $3 AND r.key = $4 AND r.attempt_id = $5)
  FROM eo_transaction_record t WHERE t.endpoint = $1 AND t.partition_key = $2"""

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
SELECT tr.version, {_RECORDS_OF.format(extra="").replace("t.endpoint", "$1")
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


CLEAR = f"""
WITH {_CLEAR_TR},
del AS (
  DELETE FROM eo_side_effect_record r USING tr
   WHERE r.endpoint = $1 AND r.partition_key = $2
     AND (r.kind, r.key) IN (SELECT * FROM unnest($4::text[], $5::text[]))),
def AS (
  INSERT INTO eo_deferred_cleanup (endpoint, kind, key, payload, due)
  SELECT $1, k, ky, p, $9 FROM tr, unnest($6::text[], $7::text[], $8::jsonb[]) AS x(k, ky, p)),
{_consume("$10")}"""

# CLEAR of the plain case: no record row to delete, no loser to list. $1-$3 as CLEAR, $4 the
# token to consume.
CLEAR_CONSUMING = f"""
WITH {_CLEAR_TR},
{_consume("$4")}"""

SELECT_PROCESSED = """
SELECT partition_key, outgoing, processed_at, body_sha256, digest FROM eo_processed_message
 WHERE endpoint = $1 AND producer = $3 AND message_id = $2"""

SELECT_REPLY = "SELECT status, body FROM eo_stored_reply WHERE endpoint = $1 AND message_id = $2"
DELETE_REPLY = "DELETE FROM eo_stored_reply WHERE endpoint = $1 AND message_id = $2"

COMMITTED_BEFORE = """
SELECT partition_key, message_id, attempt_id, version, committed_at FROM eo_transaction_record
 WHERE endpoint = $1 AND committed_at < $2"""

DUE_CLEANUPS = """
SELECT cleanup_id, kind, key, payload, due FROM eo_deferred_cleanup
 WHERE endpoint = $1 AND due <= $2 ORDER BY cleanup_id LIMIT 1000"""

DROP_CLEANUPS = "DELETE FROM eo_deferred_cleanup WHERE endpoint = $1 AND cleanup_id = ANY($2)"

ABANDONED = f"""
SELECT t.partition_key, t.version, {_RECORDS_OF.format(extra="AND r.registered_at < $2")}
       AS records
  FROM eo_transaction_record t
 WHERE t.endpoint = $1 AND t.message_id IS NULL AND EXISTS (
   SELECT 1 FROM eo_side_effect_record r
    WHERE r.endpoint = t.endpoint AND r.partition_key = t.partition_key
      AND r.registered_at < $2)
 LIMIT 1000"""

TAKE_OVER = """
WITH tr AS (
  UPDATE eo_transaction_record SET version = version + 1
   WHERE endpoint = $1 AND partition_key = $2 AND version = $3 AND message_id IS NULL
  RETURNING 1),
del AS (
  DELETE FROM eo_side_effect_record r USING tr
   WHERE r.endpoint = $1 AND r.partition_key = $2
     AND (r.kind, r.key) IN (SELECT * FROM unnest($4::text[], $5::text[]))),
def AS (
  INSERT INTO eo_deferred_cleanup (endpoint, kind, key, payload, due)
  SELECT $1, k, ky, p, $7 FROM tr, unnest($4::text[], $5::text[], $6::jsonb[]) AS x(k, ky, p))
SELECT count(*) FROM tr"""

PURGE_PROCESSED = """
WITH gone AS (DELETE FROM eo_processed_message WHERE endpoint = $1 AND processed_at < $2
              RETURNING 1)
SELECT count(*) FROM gone"""

UNFINISHED = """
SELECT count(*) FROM eo_transaction_record WHERE endpoint = $1 AND message_id IS NOT NULL"""

CLEANUP_COUNT = "SELECT count(*) FROM eo_deferred_cleanup WHERE endpoint = $1"

# The batched token path (application/token_batch.py): one statement for many partitions.
# Each partition keeps the guard of its single statement above; the transaction records a
# statement writes are locked first, in partition order, so concurrent batches cannot
# deadlock. Every row of a batch is found by its own index lookup (a LATERAL subquery with
# LIMIT 1 is not flattened into a join), whatever the planner's statistics: on a table
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
# read as `_TOKEN_JOIN` is to LOAD's: whether it exists and the message it holds
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
       {_RECORDS_OF.format(extra="").replace("t.endpoint", "$1")
                   .replace("t.partition_key", "tr.partition_key")} AS records
  FROM tr"""

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
