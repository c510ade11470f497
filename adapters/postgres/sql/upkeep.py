"""The sweeper's statements (finished transactions, due clean-ups, abandoned attempts taken
over, processed-message rows purged) and the store's gauges."""

from __future__ import annotations

from adapters.postgres.sql.attempt import RECORDS_OF
from adapters.postgres.sql.writes import losers_cleaned

COMMITTED_BEFORE = """
SELECT partition_key, message_id, attempt_id, version, committed_at FROM eo_transaction_record
 WHERE endpoint = $1 AND committed_at < $2"""

DUE_CLEANUPS = """
SELECT cleanup_id, kind, key, payload, due FROM eo_deferred_cleanup
 WHERE endpoint = $1 AND due <= $2 ORDER BY cleanup_id LIMIT 1000"""

DROP_CLEANUPS = "DELETE FROM eo_deferred_cleanup WHERE endpoint = $1 AND cleanup_id = ANY($2)"

ABANDONED = f"""
SELECT t.partition_key, t.version, {RECORDS_OF.format(extra="AND r.registered_at < $2")}
       AS records
  FROM eo_transaction_record t
 WHERE t.endpoint = $1 AND t.message_id IS NULL AND EXISTS (
   SELECT 1 FROM eo_side_effect_record r
    WHERE r.endpoint = t.endpoint AND r.partition_key = t.partition_key
      AND r.registered_at < $2)
 LIMIT 1000"""

TAKE_OVER = f"""
WITH tr AS (
  UPDATE eo_transaction_record SET version = version + 1
   WHERE endpoint = $1 AND partition_key = $2 AND version = $3 AND message_id IS NULL
  RETURNING 1),
{losers_cleaned(("$4", "$5", "$6"), "$7")}
SELECT count(*) FROM tr"""

PURGE_PROCESSED = """
WITH gone AS (DELETE FROM eo_processed_message WHERE endpoint = $1 AND processed_at < $2
              RETURNING 1)
SELECT count(*) FROM gone"""

UNFINISHED = """
SELECT count(*) FROM eo_transaction_record WHERE endpoint = $1 AND message_id IS NOT NULL"""

CLEANUP_COUNT = "SELECT count(*) FROM eo_deferred_cleanup WHERE endpoint = $1"
