"""One Spark session for the whole test run (starting one costs seconds): local, 2 cores,
driver on 127.0.0.1, UI off, the PostgreSQL JDBC driver on the class path. tests/conftest.py
imports the fixture; under `./dev test` the files that use it all run in one xdist process,
so the run starts one (tests/support/xdist_groups.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The session (`tools.pipeline.spark.build_session`, local[2]), stopped at the end."""
    from tools.pipeline.spark import build_session

    session = build_session(master="local[2]", app_name="eo-tests", driver_memory="1g",
                            shuffle_partitions=4)
    yield session
    session.stop()
