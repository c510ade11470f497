"""How `./dev test` shares the suite out to its pytest-xdist processes (`--dist loadgroup`):
each test file goes whole to one process, as `--dist loadfile` would send it (its module
fixtures made once), except the files that use Spark, which all go to one process together:
one JVM and one standalone cluster for all of them, where `loadfile` started one per process
that got such a file (two `local[2]` JVMs on a machine of two cores).

tests/conftest.py calls these functions from its hooks:

- `mark_groups` (collection, in every process): an `xdist_group` mark on every test that has
  none: "spark" for the tests of a file that uses a Spark fixture (`SPARK_FIXTURES`), else
  the test's file. Without xdist (`-n 0`) the marks change nothing.
- `publish_groups` (a worker, after collection): each test's group written to a file of the
  controller's directory (`share_directory`, named to the worker in its `workerinput`).
- `GroupScheduling` (the controller): `loadfile`'s scheduler whose unit of work is the group
  the workers published.

pytest-xdist's own `loadgroup` scheduler reads the marks through test IDs that its workers
rename "<id>@<group>"; pytest 9.2's structured IDs silently ignore that renaming (pytest-xdist
issue 1386, open with xdist 3.8), so every test would be sent out alone. The groups are
passed aside instead, and test IDs stay as they are (a failure's ID can be pasted to rerun it).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

#: The fixtures that start Spark: the shared local session (tests/support/spark.py) and the
#: sample's standalone cluster (tests/sample/pipeline/conftest.py, absent without the sample).
SPARK_FIXTURES = frozenset({"spark", "spark_cluster"})
#: The group of every test of a file that uses one of them.
SPARK_GROUP = "spark"
#: The `workerinput` key naming the directory where the workers write the groups.
WORKER_INPUT_KEY = "eo_xdist_groups"
_DIRECTORY = pytest.StashKey[Path]()


def _file(nodeid: str) -> str:
    """A test ID's file part, as `--dist loadfile` groups them ("tests/x.py")."""
    return nodeid.split("::", 1)[0]


def mark_groups(items: Iterable[pytest.Item]) -> None:
    """Add to each item without an `xdist_group` mark the mark of its group: SPARK_GROUP
    when an item of its file requests a fixture of SPARK_FIXTURES (the whole file, so that
    its module fixtures are made once), else its file's path relative to the root directory.
    A test's own mark wins."""
    items = list(items)
    spark_files = {_file(item.nodeid) for item in items
                   if SPARK_FIXTURES.intersection(getattr(item, "fixturenames", ()))}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            file = _file(item.nodeid)
            item.add_marker(pytest.mark.xdist_group(SPARK_GROUP if file in spark_files
                                                    else file))


def slow_groups_first(items: list[pytest.Item]) -> None:
    """Reorder `items` (in place, after `mark_groups`) so that the scheduler hands out the
    long groups first: those with a test marked `slow(minutes=N)`, the largest N first,
    then those with any `slow` test, then the rest, each group's tests together and in
    collection order otherwise. Started late, a long group ran alone at the end while the
    other process idled (longest processing time first, the classic rule for two machines).
    The same order in every process: it depends only on the collection. pytest-xdist
    reorders the groups by their number of tests unless told `--no-loadscope-reorder`
    (./dev test tells it: a one-test file of 3 minutes went last)."""
    by_group = groups(items)
    first: dict[str, int] = {}
    weight: dict[str, float] = {}
    for index, item in enumerate(items):
        group = by_group[item.nodeid]
        first.setdefault(group, index)
        mark = item.get_closest_marker("slow")
        if mark is not None:
            weight[group] = max(weight.get(group, 0.0), float(mark.kwargs.get("minutes", 0.0)))
    position = {item.nodeid: index for index, item in enumerate(items)}

    def key(item: pytest.Item) -> tuple[float, bool, int, int]:
        group = by_group[item.nodeid]
        return (-weight.get(group, -1.0), group not in weight, first[group],
                position[item.nodeid])

    items.sort(key=key)


def groups(items: Iterable[pytest.Item]) -> dict[str, str]:
    """Each item's group by its test ID: its closest `xdist_group` mark's name (first
    argument or `name=`), else its file."""
    found = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        name = (mark.args[0] if mark.args else mark.kwargs.get("name")) if mark else None
        found[item.nodeid] = str(name) if name is not None else _file(item.nodeid)
    return found


def share_directory(config: pytest.Config, workerinput: dict[str, Any]) -> None:
    """In the controller: name to a worker about to start (its `workerinput`) the directory
    where it writes its groups, made on the first call and removed by `remove_directory`.
    Raises OSError when the temporary directory cannot be made."""
    if _DIRECTORY not in config.stash:
        config.stash[_DIRECTORY] = Path(tempfile.mkdtemp(prefix="eo-xdist-groups-"))
    workerinput[WORKER_INPUT_KEY] = str(config.stash[_DIRECTORY])


def remove_directory(config: pytest.Config) -> None:
    """In the controller: remove the directory of `share_directory`, if one was made."""
    directory = config.stash.get(_DIRECTORY, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def publish_groups(config: pytest.Config, items: Iterable[pytest.Item]) -> None:
    """In a worker that was named a directory (`share_directory`): write `groups(items)` to
    "<worker id>.json" there, whole or not at all (a file renamed into place). Does nothing
    elsewhere (`-n 0`, another `--dist`). Raises OSError when the file cannot be written."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or WORKER_INPUT_KEY not in workerinput:
        return
    directory = Path(workerinput[WORKER_INPUT_KEY])
    target = directory / f"{workerinput['workerid']}.json"
    partial = target.with_suffix(".part")
    partial.write_text(json.dumps(groups(items)))
    os.replace(partial, target)


def read_groups(directory: Path) -> dict[str, str]:
    """The groups that the workers wrote into `directory`, by test ID (all workers collect
    the same tests, so the same groups). Raises OSError or ValueError on an unreadable file."""
    found: dict[str, str] = {}
    for path in sorted(directory.glob("*.json")):
        found.update(json.loads(path.read_text()))
    return found


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """In the controller, for `--dist loadgroup`: a `GroupScheduling` reading the directory
    of `share_directory`."""
    from xdist.scheduler import LoadFileScheduling

    class GroupScheduling(LoadFileScheduling):
        """`--dist loadfile`'s scheduler whose unit of work is a group (`read_groups`, read
        once every worker has collected) instead of a file: the tests of a group go to one
        worker, in their collection order. A test without a published group is its file's."""

        def __init__(self, config: pytest.Config, log: Any = None) -> None:
            super().__init__(config, log)
            self.groups: Mapping[str, str] = {}

        def schedule(self) -> None:
            directory = self.config.stash.get(_DIRECTORY, None)
            if not self.groups and directory is not None:
                self.groups = read_groups(directory)
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

    return GroupScheduling(config, log)
