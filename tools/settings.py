"""The tools' settings: the framework's plus their own (`EO_` variables too)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

from pydantic import Field

from entrypoints.settings import Settings, load_settings_as


class ToolSettings(Settings):
    """`Settings` plus what only the tools read:

    - `credit_limit`: the sample's payments accounts open with TPC-H `c_acctbal` plus this
      (the demo, the chaos campaign and the audit's oracle);
    - `spark_master`, `spark_driver_memory`, `spark_jdbc_jar`, `spark_python`: `eo
      pipeline`'s Spark;
    - `audit_older_than_s`: the audit's threshold for orphans, tokens and unfinished TRs.
    """

    credit_limit: Decimal = Field(Decimal("1000000"), ge=0,
                                  description="sample payments accounts: c_acctbal plus this")
    spark_master: str = Field("local[*]", min_length=1,
                              description="Spark master of `eo pipeline` (local[*], spark://...)")
    spark_driver_memory: str = Field("1g", pattern=r"^\d+[kmgt]?$",
                                     description="spark.driver.memory, e.g. 1g")
    spark_jdbc_jar: Path | None = Field(
        None, description="PostgreSQL JDBC driver jar; default: Debian's libpostgresql-jdbc-java")
    spark_python: str | None = Field(
        None, min_length=1,
        description="the executors' Python (spark.pyspark.python); default: PYSPARK_PYTHON, "
                    "else this driver's interpreter")
    audit_older_than_s: float = Field(
        3600.0, ge=0, description="audit: orphans, tokens and unfinished TRs older than this")


def load_tool_settings(**overrides: object) -> ToolSettings:
    """`ToolSettings` from the environment plus `overrides`; raises `SettingsError` naming
    the variable of the first invalid setting."""
    return load_settings_as(ToolSettings, **overrides)

