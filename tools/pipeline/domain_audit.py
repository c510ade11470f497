"""How a service adds its own findings to `eo pipeline audit` (tools/pipeline/audit.py): a
`DomainAudit` (the sample's: tools/tpch/audit.py) returns a `Finding` per name, given the
audit's `AuditRun`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tools.pipeline.audit_config import AuditConfig
    from tools.pipeline.stages import StageTimer


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
