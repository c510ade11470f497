"""How `./dev test` shares a suite out (tests/support/xdist_groups.py), on a small suite of
its own run by pytest in a subprocess with the suite's hooks: under `-n 2 --dist loadgroup`
each file goes whole to one worker and all the files that use Spark to the same one, test
IDs unchanged; under `-n 0` the marks are harmless."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts processes, a JVM or explores exhaustively

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = '''
import pytest

from tests.conftest import (
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_configure_node,
    pytest_unconfigure,
    pytest_xdist_make_scheduler,
)


@pytest.fixture(scope="session")
def spark():
    return "a session"


@pytest.fixture(scope="session")
def spark_cluster():
    return "spark://nowhere"
'''
SPARK_FILES = {
    "test_session.py": "def test_one(spark): pass\ndef test_two(spark): pass\n",
    # a file is a Spark file as a whole: its test without a Spark fixture goes along
    "test_cluster.py": "def test_cluster(spark_cluster): pass\ndef test_plain(): pass\n",
    "test_tail.py": "import pytest\n@pytest.mark.parametrize('n', range(3))\n"
                    "def test_n(spark, n): pass\n",
}
PLAIN_FILES = {f"test_plain_{i}.py": "".join(f"def test_{j}(): pass\n" for j in range(4))
               for i in range(4)}


def _suite(root: Path) -> None:
    (root / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers -p no:cacheprovider\n")
    (root / "conftest.py").write_text(CONFTEST)
    for name, text in {**SPARK_FILES, **PLAIN_FILES}.items():
        (root / name).write_text(text)


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest with no plugin but those of `args` (the environment's take seconds to load)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-v", "-W", "error", *args],
                          cwd=root, env=env, capture_output=True, text=True, timeout=180)


def test_files_go_whole_to_a_worker_and_the_spark_files_to_the_same_one(tmp_path: Path
                                                                         ) -> None:
    _suite(tmp_path)
    result = _pytest(tmp_path, "-p", "xdist.plugin", "-n", "2", "--dist", "loadgroup")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "scheduling tests via GroupScheduling" in result.stdout
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+)\s*$", result.stdout, re.M)
    assert len(ran) == 2 + 2 + 3 + 4 * 4
    assert [test for _, test in ran if "@" in test] == []  # the IDs as pytest names them
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, test in ran:
        file = test.split("::", 1)[0]
        workers["spark" if file in SPARK_FILES else file].add(worker)
    assert {group: len(found) for group, found in workers.items()} == dict.fromkeys(
        ["spark", *PLAIN_FILES], 1)


def test_without_xdist_the_marks_are_harmless(tmp_path: Path) -> None:
    _suite(tmp_path)
    for args in (["-p", "xdist.plugin", "-n", "0"], []):  # without xdist's plugin too
        result = _pytest(tmp_path, *args)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "23 passed" in result.stdout


class _Item:
    """What `slow_groups_first` reads of a test: its ID and its marks."""

    def __init__(self, nodeid: str, slow: float | None = None) -> None:
        self.nodeid = nodeid
        self._slow = slow

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        if name == "slow" and self._slow is not None:
            marked = pytest.mark.slow(minutes=self._slow) if self._slow else pytest.mark.slow
            return marked.mark
        return None


def test_the_longest_groups_are_handed_out_first_each_group_together() -> None:
    from tests.support.xdist_groups import slow_groups_first

    items = [_Item("a.py::t1"), _Item("b.py::t1", slow=0), _Item("a.py::t2"),
             _Item("c.py::t1", slow=2), _Item("d.py::t1", slow=6), _Item("c.py::t2"),
             _Item("e.py::t1")]
    slow_groups_first(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["d.py::t1", "c.py::t1", "c.py::t2", "b.py::t1",
                                         "a.py::t1", "a.py::t2", "e.py::t1"]
