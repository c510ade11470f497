"""One Spark session for the whole test run (starting one costs seconds): local, 2 cores,
driver on 127.0.0.1, UI off, the PostgreSQL JDBC driver on the class path."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tools.pipeline.spark import build_session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_session(master="local[2]", app_name="eo-tests", driver_memory="1g",
                            shuffle_partitions=4)
    yield session
    session.stop()
