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
(tools/pipeline/domain_audit.py; the sample's TPC-H oracle: tools/tpch/audit.py). The
dead-letter queues' depths are counted by the caller (a broker is no Spark source).

This module runs the audit (`run_audit`) and holds its result; what it audits is
tools/pipeline/audit_config.py, the keys and objects it compares tools/pipeline/named_keys.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tools.pipeline.audit_config import AuditConfig
from tools.pipeline.domain_audit import AuditRun, DomainAudit, Finding
from tools.pipeline.named_keys import (
    RECORDED_BLOB_KEYS,
    key_prefix,
    missing_objects,
    named_keys_query,
    orphan_objects,
)
from tools.pipeline.parquet import count_rows, read_rows
from tools.pipeline.sources import read_query, sql_literal
from tools.pipeline.stages import Stage, StageTimer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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
    stamp = sql_literal(cutoff.isoformat()) + "::timestamptz"
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
