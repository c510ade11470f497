"""The tables of an `eo bench` run (tools/bench/run.py): emptied before it, and what is left
in them after it (the handler's count, each path's deduplication rows, what must be gone)."""

from __future__ import annotations

import uuid
from typing import Any

from tools.bench import references
from tools.bench.worker import TEMPLATE_PATHS

_EO_TABLES = ("eo_transaction_record", "eo_side_effect_record", "eo_deferred_cleanup",
              "eo_processed_message", "eo_stored_reply", "eo_state_entry")
_NEWEST = ("(SELECT DISTINCT ON (partition_key) state FROM eo_state_entry WHERE endpoint = $1 "
           "ORDER BY partition_key, version DESC) AS newest")
_COUNT = "coalesce(sum((state->>'count')::bigint), 0)"
#: DBOS's tables that grow with the workflows it runs (`TRUNCATE`d before each run)
_DBOS_TABLES = ("workflow_status", "workflow_input", "workflow_output", "operation_outputs",
                "datasource_outputs", "workflow_events", "workflow_events_history",
                "notifications", "streams")


async def truncate_tables(admin: Any) -> None:
    """Every run starts from empty tables (of the bench's own database), the template's as
    the references': deleted rows would stay behind as dead tuples until a vacuum (a server
    with autovacuum off, as CI configurations may have, made each run read those of all the
    runs before it)."""
    await admin.execute(f"TRUNCATE eo_token, {', '.join((*_EO_TABLES, *references.TABLES))}")
    # DBOS's, once a `dbos` run has made them: every workflow it ran, kept for ever
    dbos = [str(r["name"]) for r in await admin.fetch(
        "SELECT format('%I.%I', table_schema, table_name) AS name "
        "FROM information_schema.tables WHERE table_schema = $1 AND table_name = ANY($2)",
        references.DBOS_SCHEMA, list(_DBOS_TABLES))]
    if dbos:
        await admin.execute(f"TRUNCATE {', '.join(dbos)} CASCADE")


async def at_rest(admin: Any, path: str, work: str, incoming: list[uuid.UUID]
                   ) -> dict[str, int]:
    """Rows left once the consumers stopped: the handler's count summed over the accounts,
    the biggest account's state in bytes (`state_bytes`), and each path's deduplication
    rows (`dedup_rows`, see report.DEDUP_ROWS)."""
    strategy = TEMPLATE_PATHS.get(path, (path,))[0]
    # where the path keeps each account's state, for the handler's count and the biggest size
    if strategy in ("token", "outbox"):
        states = "eo_transaction_record WHERE endpoint = $1"
    elif strategy == "state":
        states = _NEWEST
    else:
        states = "bench_state WHERE $1::text IS NOT NULL"
    dedup = {"token": ("SELECT count(*) FROM eo_token WHERE message_id = ANY($1)", incoming),
             "outbox": ("SELECT count(*) FROM eo_processed_message WHERE endpoint = $1", work),
             "state": ("SELECT count(*) FROM eo_state_entry WHERE endpoint = $1", work),
             "dbos": (f"SELECT count(*) FROM {references.DBOS_SCHEMA}.workflow_status "
                      "WHERE workflow_uuid = ANY($1::text[])", [str(i) for i in incoming])}.get(
        strategy, ("SELECT count(*) FROM bench_inbox WHERE $1::text IS NOT NULL", work))
    queries = {
        "processed": (f"SELECT {_COUNT} FROM {states}", work),
        # the biggest account's state as stored (its JSON text's bytes): the shape's size
        "state_bytes": (f"SELECT coalesce(max(octet_length(state::text)), 0) FROM {states}",
                        work),
        "dedup_rows": dedup,
        "side_effect_records_left": (
            "SELECT count(*) FROM eo_side_effect_record WHERE endpoint = $1", work),
        "unfinished_trs": ("SELECT count(*) FROM eo_transaction_record WHERE endpoint = $1 "
                           "AND message_id IS NOT NULL", work),
        "outbox_rows_left": ("SELECT count(*) FROM bench_outbox WHERE $1::text IS NOT NULL",
                             work),
        # the outputs' tokens belong to the receiver that would consume them (nobody here)
        "output_tokens": ("WITH gone AS (DELETE FROM eo_token WHERE type = 'Deposited' "
                          "AND $1::text IS NOT NULL RETURNING 1) SELECT count(*) FROM gone",
                          work),
    }
    return {name: int(await admin.fetchval(query, arg))
            for name, (query, arg) in queries.items()}
