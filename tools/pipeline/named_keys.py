"""The blob keys of `eo pipeline audit` (tools/pipeline/audit.py): the SQL that reads the
endpoints' states and the keys they name (run by PostgreSQL), and the Spark joins of those
keys with the bucket's listing that find orphan and missing objects."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from domain.context import ARTIFACT_KEY_IN_TEXT, UUID5_TEXT
from tools.pipeline.sources import sql_literal

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def artifact_key_pattern(prefixes: Sequence[str]) -> str:
    """A regular expression (Java's and Python's) for `domain.context.is_artifact_key`."""
    alternatives = "|".join(re.escape(p) for p in prefixes)
    return f"^({alternatives})/{UUID5_TEXT}$"


def states_source(endpoint: str, stream: bool = False) -> str:
    """SQL for `endpoint`'s business states (partition_key text, state jsonb): from the
    transaction records, or the newest entry of each partition's state stream."""
    if stream:
        return ("SELECT DISTINCT ON (partition_key) partition_key, state FROM eo_state_entry "
                f"WHERE endpoint = {sql_literal(endpoint)} AND state IS NOT NULL "
                "ORDER BY partition_key, version DESC")
    return ("SELECT partition_key, state FROM eo_transaction_record "
            f"WHERE endpoint = {sql_literal(endpoint)} AND state IS NOT NULL")


def named_keys_query(endpoint: str, fields: Sequence[str] = (), stream: bool = False) -> str:
    """SQL for the blob keys `endpoint`'s states name: endpoint, partition_key, key. From
    the top-level `fields` when given (strings only), else every artifact key in the state's
    JSON text (`ARTIFACT_KEY_IN_TEXT`, PostgreSQL's `regexp_matches`)."""
    source = states_source(endpoint, stream)
    name = sql_literal(endpoint)
    if fields:
        return " UNION ALL ".join(
            f"SELECT {name} AS endpoint, partition_key, state->>{sql_literal(f)} AS key "
            f"FROM ({source}) AS s WHERE jsonb_typeof(state->{sql_literal(f)}) = 'string'"
            for f in fields)
    return (f"SELECT {name} AS endpoint, partition_key, m[1] AS key FROM ({source}) AS s, "
            f"regexp_matches(s.state::text, {sql_literal(ARTIFACT_KEY_IN_TEXT)}, 'g') AS m")


#: Blob keys the protocol's own rows name (in flight or awaiting clean-up): never orphans.
RECORDED_BLOB_KEYS = ("SELECT key FROM eo_side_effect_record WHERE kind = 'blob' UNION ALL "
                      "SELECT key FROM eo_deferred_cleanup WHERE kind = 'blob'")


def key_prefix(key: Any) -> Any:
    """A Spark column: the prefix of artifact key column `key` (all before its last '/')."""
    from pyspark.sql import functions as F

    return F.regexp_extract(key, "^(.*)/[^/]+$", 1)


def orphan_objects(listing: DataFrame, named: DataFrame, cutoff: datetime,
                   prefixes: Sequence[str] | None = None) -> DataFrame:
    """Objects of `listing` (key, size, last_modified) that no key of `named` (key) names and
    last modified before `cutoff`: key, size, last_modified. With `prefixes`, only the
    service's own keys (`domain.context.is_artifact_key` under them) can be orphans: an
    object of anyone else sharing the bucket is none of the audit's business. The anti join
    needs no `distinct` of `named` (a key named twice excludes its object once): one
    aggregation of every named key less, a quarter of the time at 10M keys."""
    from pyspark.sql import functions as F

    old = listing.where(F.col("last_modified") < F.lit(cutoff))
    if prefixes is not None:
        old = old.where(F.col("key").rlike(artifact_key_pattern(prefixes)))
    return old.join(named.select("key"), "key", "left_anti")


def missing_objects(named: DataFrame, listing: DataFrame) -> DataFrame:
    """Keys of `named` (endpoint, partition_key, key: what the states name) with no object
    in `listing`: key, endpoint, partition_key."""
    return named.join(listing.select("key"), "key", "left_anti").select(
        "key", "endpoint", "partition_key")
