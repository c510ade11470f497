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


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone Spark master and worker (tests/sample/pipeline/cluster.py): the URL."""
    from tests.sample.pipeline.cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as master:
        yield master
