"""The exactly-once audit (`eo pipeline audit`): the independent safety net of protocol 8,
for every endpoint of the registry.

Spark reads the stores at rest and the bucket's listing and writes each finding as a Parquet
dataset of offending rows under the output directory. The protocol's findings, for any
service:

- `stale_tokens`: tokens older than the threshold that no dead letter keeps: a message that
  was neither processed nor dead-lettered (or a token left behind);
- `dead_letter_tokens`: tokens kept by a dead letter still waiting for an operator (`eo
  dead-letters replay` or `discard`): a message not processed;
- `stale_transactions`: transaction records committed longer ago than the threshold and
  never finished;
- `orphans`: objects older than the threshold under the blob endpoints' prefixes that no
  state, blob side-effect record or deferred clean-up names;
- `missing_objects`: artifact keys a committed state names with no object in the bucket.

Where a state names blobs comes from the registry (`Registration.blob_fields`, else every
artifact key in the state's JSON, found by PostgreSQL, in every endpoint's states), and so
do the prefixes an orphan may have (`Registration.blob_prefixes`, else the prefixes of the
keys the states and records name). A service adds its own findings with a `DomainAudit`
(the sample's TPC-H oracle: tools/tpch/audit.py). The dead-letter queues' depths are
counted by the caller (a broker is no Spark source).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from domain.context import ARTIFACT_KEY_IN_TEXT, UUID5_TEXT
from tools.pipeline.sources import Jdbc, read_query

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from entrypoints.settings import Service

FINDINGS = ("orphans", "missing_objects", "stale_tokens", "dead_letter_tokens",
            "stale_transactions")
#: What a row of each of the protocol's findings means, in the terms the framework knows
#: for any service (artifact keys, states, tokens, records), for the report's reader.
MEANINGS = {
    "orphans": "objects under the service's artifact prefixes that no committed state, "
               "side-effect record or deferred clean-up names, older than the threshold",
    "missing_objects": "artifact keys named by committed states with no object in the bucket",
    "stale_tokens": "tokens older than the threshold that no dead letter keeps (messages "
                    "neither consumed nor dead-lettered)",
    "dead_letter_tokens": "tokens kept by dead letters waiting for an operator (replay or "
                          "discard)",
    "stale_transactions": "committed-but-unfinished transaction records older than the "
                          "threshold",
}


@dataclass(frozen=True)
class Stage:
    """One timed step: `rows` it went through (0: not counted) in `seconds` (wall clock)."""

    name: str
    seconds: float
    rows: int = 0

    @property
    def rows_per_s(self) -> float:
        """Throughput; 0 when no rows were counted or no time passed."""
        return self.rows / self.seconds if self.rows and self.seconds > 0 else 0.0


@dataclass(frozen=True)
class AuditConfig:
    """What to audit and how.

    - `database` / `tokens`: the endpoints' database and the token store (JDBC);
    - `now`, `older_than_s`: orphans, tokens and unfinished transaction records count only
      when older than `now - older_than_s` (UTC);
    - `states`: every endpoint -> the state fields naming blobs (empty: any artifact key in
      the state's JSON): whichever endpoint names an object keeps it from being an orphan;
    - `prefixes`: the prefixes an orphan may have (None: those of the keys named);
    - `streams`: endpoints keeping their states in `eo_state_entry` (strategy `state`);
    - `partitions`: parallel JDBC reads per table.
    """

    database: Jdbc
    tokens: Jdbc
    now: datetime
    older_than_s: float
    states: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    prefixes: tuple[str, ...] | None = None
    streams: frozenset[str] = frozenset()
    partitions: int = 4

    @property
    def cutoff(self) -> datetime:
        """`now - older_than_s`, UTC."""
        return self.now.astimezone(UTC) - timedelta(seconds=self.older_than_s)


def audit_config(service: Service, database: Jdbc, tokens: Jdbc, now: datetime,
                 older_than_s: float, partitions: int = 4) -> AuditConfig:
    """The audit of `service`'s registry (every endpoint's states, the blob endpoints'
    declared fields and prefixes, the `state`-strategy endpoints) on `database` and
    `tokens`."""
    from application.strategy import Strategy

    states = {r.name: r.blob_fields for r in service.registry}
    declared = [p for r in service.registry if r.blobs for p in r.blob_prefixes]
    undeclared = any(r.blobs and not r.blob_prefixes for r in service.registry)
    streams = frozenset(r.name for r in service.registry
                        if service.strategy(r.name) is Strategy.STATE)
    return AuditConfig(database, tokens, now, older_than_s, states,
                       None if undeclared else tuple(sorted(set(declared))), streams,
                       partitions)


@dataclass
class AuditResult:
    """Counts per finding (FINDINGS order), dead letters per endpoint (None: no queue),
    timed stages, up to `sample_rows` offending rows per finding, and the files written."""

    counts: dict[str, int]
    dead_letters: dict[str, int | None]
    stages: list[Stage]
    samples: dict[str, list[dict[str, Any]]]
    output: Path
    cutoff: datetime
    files: dict[str, Path] = field(default_factory=dict)
    #: the prefixes orphans were looked for under (declared, or derived from the keys named)
    prefixes: tuple[str, ...] = ()
    #: what each finding's rows mean (`Finding.meaning`), for the report
    meanings: dict[str, str] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        """Offending rows of every finding plus messages in dead-letter queues."""
        return sum(self.counts.values()) + sum(n or 0 for n in self.dead_letters.values())

    def summary(self) -> dict[str, Any]:
        """The JSON summary: counts, dead letters, cutoff, stages (seconds, rows, rows/s)."""
        return {
            "violations": self.violations,
            "counts": self.counts,
            "dead_letters": self.dead_letters,
            "cutoff": self.cutoff.isoformat(),
            "prefixes": list(self.prefixes),
            "stages": [{"name": s.name, "seconds": round(s.seconds, 3), "rows": s.rows,
                        "rows_per_s": round(s.rows_per_s)} for s in self.stages],
            "files": {k: str(v) for k, v in self.files.items()},
        }


def artifact_key_pattern(prefixes: Sequence[str]) -> str:
    """A regular expression (Java's and Python's) for `domain.context.is_artifact_key`."""
    alternatives = "|".join(re.escape(p) for p in prefixes)
    return f"^({alternatives})/{UUID5_TEXT}$"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def states_source(endpoint: str, stream: bool = False) -> str:
    """SQL for `endpoint`'s business states (partition_key text, state jsonb): from the
    transaction records, or the newest entry of each partition's state stream."""
    if stream:
        return ("SELECT DISTINCT ON (partition_key) partition_key, state FROM eo_state_entry "
                f"WHERE endpoint = {_literal(endpoint)} AND state IS NOT NULL "
                "ORDER BY partition_key, version DESC")
    return ("SELECT partition_key, state FROM eo_transaction_record "
            f"WHERE endpoint = {_literal(endpoint)} AND state IS NOT NULL")


def named_keys_query(endpoint: str, fields: Sequence[str] = (), stream: bool = False) -> str:
    """SQL for the blob keys `endpoint`'s states name: endpoint, partition_key, key. From
    the top-level `fields` when given (strings only), else every artifact key in the state's
    JSON text (`ARTIFACT_KEY_IN_TEXT`, PostgreSQL's `regexp_matches`)."""
    source = states_source(endpoint, stream)
    name = _literal(endpoint)
    if fields:
        return " UNION ALL ".join(
            f"SELECT {name} AS endpoint, partition_key, state->>{_literal(f)} AS key "
            f"FROM ({source}) AS s WHERE jsonb_typeof(state->{_literal(f)}) = 'string'"
            for f in fields)
    return (f"SELECT {name} AS endpoint, partition_key, m[1] AS key FROM ({source}) AS s, "
            f"regexp_matches(s.state::text, {_literal(ARTIFACT_KEY_IN_TEXT)}, 'g') AS m")


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


class DomainAudit(Protocol):
    """A service's own findings beside the protocol's (the sample's: tools/tpch/audit.py).

    `names`: the findings it adds, in report order. `findings(run)`: each as a `Finding`
    (lazy DataFrames; reads it wants timed go through `run.timer`); it raises `InputError`
    for bad input of its own (exit 2), Spark's errors unchanged."""

    names: tuple[str, ...]

    def findings(self, run: AuditRun) -> dict[str, Finding]: ...

    def finished(self) -> None:
        """Called once every finding is written: release what `findings` cached."""


@dataclass(frozen=True)
class Finding:
    """One finding to write: its offending rows, the stage label, the rows the stage went
    through (given the finding's count; 0: not counted), and what an offending row means,
    for the report's reader (in the words of whoever adds the finding)."""

    frame: DataFrame
    label: str
    rows: Callable[[int], int] = lambda _n: 0
    meaning: str = ""


@dataclass(frozen=True)
class AuditRun:
    """What a `DomainAudit` gets: the session, the config, a partitioned JDBC read of the
    endpoints' database (`query(sql, split_on)`), the timer of the audit's stages and the
    listing."""

    spark: SparkSession
    config: AuditConfig
    query: Callable[..., DataFrame]
    timer: StageTimer
    listing: DataFrame


class StageTimer:
    """Runs the audit's stages, timing each (`stages`) and telling `progress` its name."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        self.progress = progress
        self.stages: list[Stage] = []

    def run(self, name: str, action: Callable[[], int], rows: Callable[[int], int] | None = None
            ) -> int:
        """Run `action` as stage `name` and return its result (a count); the stage's rows
        are `rows(result)`, else the result itself."""
        self.progress(name)
        started = time.perf_counter()
        result = action()
        self.stages.append(Stage(name, time.perf_counter() - started,
                                 rows(result) if rows else result))
        return result


def _parquet_source(path: Path) -> str:
    """`read_parquet('<path>/*.parquet')` with the path as an escaped SQL string literal."""
    return f"read_parquet({_literal((path / '*.parquet').as_posix())})"


def _identifier(name: str) -> str:
    """`name` as a quoted SQL identifier (embedded quotes doubled): a column name read from
    a file must never become SQL (the security review ran `COPY ... TO` through one)."""
    return '"' + name.replace('"', '""') + '"'


def count_rows(path: Path) -> int:
    """Rows of the Parquet dataset Spark wrote to directory `path` (from the files' footers,
    through DuckDB: no Spark job)."""
    import duckdb

    if not any(path.glob("*.parquet")):
        return 0
    with duckdb.connect() as con:
        found = con.execute(f"SELECT count(*) FROM {_parquet_source(path)}").fetchone()
    return int(found[0]) if found else 0


def read_rows(path: Path, limit: int | None = None,
              columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Rows of the Parquet dataset in directory `path` as dicts (Decimal, list, datetime
    values), at most `limit` of them (None: all), with `columns` only when given (a fixed
    set: a missing one raises duckdb's BinderException). Column names are quoted, never
    trusted as SQL."""
    import duckdb

    if not any(path.glob("*.parquet")):
        return []
    source = _parquet_source(path)
    with duckdb.connect() as con:
        described = con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
        kinds = {str(name): str(kind) for name, kind, *_ in described}
        wanted = list(columns) if columns is not None else list(kinds)
        # instants as naive UTC (DuckDB needs pytz for aware ones), made aware below
        aware = {n for n in wanted if "WITH TIME ZONE" in kinds.get(n, "")}
        selected = ", ".join(
            f"timezone('UTC', {_identifier(n)}) AS {_identifier(n)}" if n in aware
            else _identifier(n) for n in wanted)
        query = f"SELECT {selected} FROM {source}"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        cursor = con.execute(query)
        names = [d[0] for d in cursor.description or ()]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    for row in rows:
        for name in aware:
            if row[name] is not None:
                row[name] = row[name].replace(tzinfo=UTC)
    return rows


def run_audit(
    spark: SparkSession,
    config: AuditConfig,
    listing: DataFrame,
    output: Path,
    dead_letters: Mapping[str, int | None] | None = None,
    progress: Callable[[str], None] = lambda _stage: None,
    sample_rows: int = 10,
    domain: DomainAudit | None = None,
) -> AuditResult:
    """Run the protocol's checks (and `domain`'s) and write each finding to
    `output/<finding>` (Parquet, overwritten).

    `listing` is the bucket's objects (listing.LISTING_SCHEMA); `dead_letters` the depth of
    each endpoint's dead-letter queue, if counted. `progress` is called with each stage's
    name as it starts. Raises pyspark's errors (e.g. an unreachable database) unchanged.
    """
    from pyspark.sql import functions as F

    output.mkdir(parents=True, exist_ok=True)
    # readable by any Parquet reader (the default, INT96, is Spark's legacy encoding)
    spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
    timer = StageTimer(progress)
    cutoff = config.cutoff
    db, parts = config.database, config.partitions

    def query(sql: str, split_on: str = "partition_key") -> DataFrame:
        return read_query(spark, db, sql, split_on, parts)

    listing = listing.cache()
    objects = timer.run("list the bucket", listing.count)
    findings: dict[str, Finding] = {}
    if domain is not None:
        findings.update(domain.findings(AuditRun(spark, config, query, timer, listing)))
    named = None
    if config.states:
        named = query(" UNION ALL ".join(
            named_keys_query(e, fields, e in config.streams)
            for e, fields in sorted(config.states.items()))).cache()
        timer.run("read the blob keys the states name (JDBC)", named.count)
    recorded = query(RECORDED_BLOB_KEYS, "key")
    every_named = recorded if named is None else named.select("key").unionByName(recorded)
    prefixes = config.prefixes
    if prefixes is None:  # the prefixes of what the states and the protocol's rows name
        prefixes = tuple(sorted(
            r[0] for r in every_named.select(key_prefix(F.col("key")).alias("p")).distinct()
            .collect() if r[0]))
    stamp = _literal(cutoff.isoformat()) + "::timestamptz"
    # read once for its two findings (those a dead letter keeps, and the others)
    tokens = read_query(
        spark, config.tokens,
        "SELECT endpoint, message_id::text AS message_id, type, created_at FROM eo_token "
        f"WHERE created_at < {stamp}", "message_id", parts).cache()
    waiting = query("SELECT DISTINCT endpoint, message_id::text AS message_id, "
                    "dead_letter_id FROM eo_dead_letter WHERE status = 'dead' AND "
                    "message_id IS NOT NULL", "message_id")
    kept = ["endpoint", "message_id"]
    unfinished = query(
        "SELECT endpoint, partition_key, message_id::text AS message_id, "
        "attempt_id::text AS attempt_id, version, committed_at FROM eo_transaction_record "
        f"WHERE message_id IS NOT NULL AND committed_at < {stamp}")
    findings.update({
        "orphans": Finding(orphan_objects(listing, every_named, cutoff, prefixes),
                           "find orphan objects", lambda _n: objects, MEANINGS["orphans"]),
        "missing_objects": Finding(
            missing_objects(named, listing) if named is not None else listing.limit(0).select(
                "key", F.lit(None).cast("string").alias("endpoint"),
                F.lit(None).cast("string").alias("partition_key")),
            "find missing objects", meaning=MEANINGS["missing_objects"]),
        "stale_tokens": Finding(tokens.join(waiting.select(*kept), kept, "left_anti"),
                                "find stale tokens (JDBC)", meaning=MEANINGS["stale_tokens"]),
        "dead_letter_tokens": Finding(tokens.join(waiting, kept, "left_semi"),
                                      "find tokens of dead letters (JDBC)",
                                      meaning=MEANINGS["dead_letter_tokens"]),
        "stale_transactions": Finding(unfinished,
                                      "find unfinished transaction records (JDBC)",
                                      meaning=MEANINGS["stale_transactions"]),
    })
    counts: dict[str, int] = {}
    files: dict[str, Path] = {}
    samples: dict[str, list[dict[str, Any]]] = {}
    for name, finding in findings.items():
        path = output / name

        def write(frame: DataFrame = finding.frame, path: Path = path) -> int:
            frame.write.mode("overwrite").parquet(str(path))
            return count_rows(path)

        counts[name] = timer.run(finding.label, write, finding.rows)
        files[name] = path
        samples[name] = read_rows(path, sample_rows)
    for frame in (listing, named, tokens):
        if frame is not None:
            frame.unpersist()
    if domain is not None:
        domain.finished()
    return AuditResult(counts, dict(dead_letters or {}), timer.stages, samples, output, cutoff,
                       files, prefixes, {n: f.meaning for n, f in findings.items()})


def write_summary(result: AuditResult) -> Path:
    """`summary.json` in the output directory (AuditResult.summary); returns its path."""
    path = result.output / "summary.json"
    path.write_text(json.dumps(result.summary(), indent=2) + "\n")
    return path
