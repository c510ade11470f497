"""A standalone Spark cluster for the pipeline tests that need one (the local session,
`spark`, is the whole suite's: tests/support/spark.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone Spark master and worker (tests/sample/pipeline/cluster.py): the URL."""
    from tests.sample.pipeline.cluster import standalone_cluster

    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster")) as master:
        yield master
