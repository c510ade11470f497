"""The statements of an attempt before its commit: the transaction record's read or
creation (with its state, its side-effect records, the delivery's token), the registration of
a side effect, and the processed-message and stored-reply look-ups."""

from __future__ import annotations

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

RECORDS_OF = """
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
       {RECORDS_OF.format(extra="")} AS records, {_IN_TOKENS_OF} AS in_tokens
  FROM eo_transaction_record t WHERE t.endpoint = $1 AND t.partition_key = $2"""

# the durability barrier after a read whose outcome is acted on outside the database (a
# finisher publishing the committed attempt it read): a commit that writes (the TR's row
# rewritten as it is) comes after every commit the read saw in the WAL, so under synchronous
# replication it returns only once the standby holds them all. A commit the primary shows may
# not be replicated yet: its COMMIT's wait for the standby was cancelled (a client's
# timeout) or the primary restarted during it (crash recovery makes it visible); a failover
# then loses it, and what was published from it is published again by another attempt. (A
# transaction that only takes an ID writes its commit record without waiting for the
# standby: `pg_current_xact_id()` is no barrier.) An idle TR's in-tokens are empty, so the
# clear's trigger (0008) never fires on it.
DURABLE = """UPDATE eo_transaction_record SET version = version
  WHERE endpoint = $1 AND partition_key = $2"""

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

SELECT_PROCESSED = """
SELECT partition_key, outgoing, processed_at, body_sha256, digest FROM eo_processed_message
 WHERE endpoint = $1 AND producer = $3 AND message_id = $2"""

SELECT_REPLY = "SELECT status, body FROM eo_stored_reply WHERE endpoint = $1 AND message_id = $2"
DELETE_REPLY = "DELETE FROM eo_stored_reply WHERE endpoint = $1 AND message_id = $2"
