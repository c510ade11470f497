"""The pipeline's jobs on a Spark standalone cluster (a master and a worker started by the
test), run from a directory that is not the project's: the executors get the project's code
from the job and the driver's interpreter, the driver its memory setting, and a failure on
the executors is reported by its cause. The ingest's and the audit's results on the cluster
are compared with `local[*]`'s in test_ingest.py and test_audit.py."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.sample.pipeline.cluster import python_elsewhere
from tools.pipeline.spark import spark_failure

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively


def test_executors_import_the_shipped_project_and_the_driver_gets_its_memory(
        spark_cluster: str, tmp_path: Path) -> None:
    result = python_elsewhere(tmp_path, textwrap.dedent(f"""
        import importlib, json, sys
        from tools.pipeline.spark import build_session

        def where(_):
            module = importlib.import_module("tools.tpch.ingest_commands")
            return module.__file__, sys.executable

        spark = build_session({spark_cluster!r}, "eo-cluster-test", driver_memory="1500m")
        found = spark.sparkContext.parallelize(range(2), 2).map(where).collect()
        heap = spark._jvm.java.lang.Runtime.getRuntime().maxMemory()
        print(json.dumps({{"found": found, "heap": heap}}))
        spark.stop()
    """))
    assert result.returncode == 0, result.stderr[-3000:]
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    for module, interpreter in answer["found"]:
        assert "eo-project.zip" in module  # the job's archive, not a directory on the path
        assert interpreter == sys.executable  # the driver's, with the project's dependencies
    assert answer["heap"] > 1200 * 2**20  # 1500m asked for; Spark's default gives about 1g


def test_a_spark_failure_is_named_by_its_cause_not_pysparks_header() -> None:
    worker = RuntimeError(
        "An error occurred while calling o91.collectToPython.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
        "8.0 failed 4 times: org.apache.spark.api.python.PythonException: Traceback (most "
        "recent call last):\n  File \"/x/pyspark.zip/pyspark/serializers.py\", line 483, in "
        "loads\n    return cloudpickle.loads(obj, encoding=encoding)\n"
        "ModuleNotFoundError: No module named 'tools'\n\tat org.apache.spark.api.python...")
    assert spark_failure(worker).startswith("ModuleNotFoundError: No module named 'tools' "
                                            "(the executors' Python: set EO_SPARK_PYTHON")
    java = RuntimeError(
        "Job aborted: java.io.IOException: Cannot run program \"/opt/py\": error=2, No such "
        "file or directory\n\tat java.base/java.lang.ProcessBuilder.start\n"
        "Caused by: java.io.IOException: error=2, No such file or directory\n")
    assert spark_failure(java).startswith('Cannot run program "/opt/py": error=2')
    plain = RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] The table `x` cannot be found.\nmore")
    assert spark_failure(plain) == "[TABLE_OR_VIEW_NOT_FOUND] The table `x` cannot be found."
