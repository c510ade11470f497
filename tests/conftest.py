"""The whole suite's guard: tests touch only what they create, and remove it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.support import xdist_groups
from tests.support.processes import leftovers
from tests.support.services import AMQP_ENV, LOCAL_AMQP, LOCAL_POSTGRES, POSTGRES_ENV
from tests.support.spark import spark  # noqa: F401 - the pipeline tests' Spark session


def pytest_configure(config: pytest.Config) -> None:
    """Declare the `xdist_group` mark, which pytest-xdist declares too: the marks of
    `pytest_collection_modifyitems` pass `--strict-markers` even with `-p no:xdist`."""
    config.addinivalue_line("markers", "xdist_group(name): the tests that `./dev test` "
                                       "runs in one process (tests/support/xdist_groups.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test's xdist group (`xdist_groups.mark_groups`): its file, or "spark" for all
    the files that use Spark; the groups with slow tests first (`slow_groups_first`)."""
    xdist_groups.mark_groups(items)
    xdist_groups.slow_groups_first(items)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """In an xdist worker: the tests' groups written for the controller's scheduler, before
    pytest-xdist's own hook tells the controller that the worker has collected."""
    xdist_groups.publish_groups(session.config, session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """In the xdist controller: a worker about to start is told where to write its groups."""
    xdist_groups.share_directory(node.config, node.workerinput)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup`: the scheduler of tests/support/xdist_groups.py (pytest-xdist's
    own does not group on pytest 9.2); any other `--dist`: pytest-xdist's."""
    if config.getvalue("dist") != "loadgroup":
        return None
    return xdist_groups.make_scheduler(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The groups' directory removed (the controller's; nothing elsewhere)."""
    xdist_groups.remove_directory(config)


#: seconds and tests by file group (`_file_group`), in this process: the controller
#: under xdist, which receives every worker's reports
_GROUP_SECONDS: dict[str, list[float]] = {}


def _file_group(nodeid: str) -> str:
    """The file group a test's time counts in: `tests/<suite>`, or `tests/sample/<part>`
    (a module directly in tests/sample is its own group)."""
    parts = nodeid.split("::", 1)[0].split("/")
    return "/".join(parts[:3] if parts[1:2] == ["sample"] and len(parts) > 3 else parts[:2])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each phase's seconds added to its test's file group."""
    seconds = _GROUP_SECONDS.setdefault(_file_group(report.nodeid), [0.0, 0.0])
    seconds[0] += report.duration
    seconds[1] += report.when == "call"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """With `--durations`: the suite's time by file group (seconds summed over the
    processes, setup and teardown included), the table docs/testing.md keeps."""
    seconds = _GROUP_SECONDS
    if not config.getoption("durations", None) or not seconds:
        return
    terminalreporter.write_sep("=", "time by file group (seconds, summed over processes)")
    total = sum(s for s, _ in seconds.values())
    for group, (spent, tests) in sorted(seconds.items(), key=lambda kv: -kv[1][0]):
        terminalreporter.write_line(f"{group:<32} {spent:8.1f} s {int(tests):6} tests "
                                    f"{spent / total:6.1%}")
    terminalreporter.write_line(f"{'all':<32} {total:8.1f} s "
                                f"{int(sum(t for _, t in seconds.values())):6} tests")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when a database or virtual host named with this run's ID is still there
    after the last test: a test made it and did not remove it (a second copy of the suite,
    or a user's own stores, must find the machine as they left it)."""
    if exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return  # interrupted or nothing collected: clean-ups may not have run
    left = leftovers(os.environ.get(POSTGRES_ENV, LOCAL_POSTGRES),
                     os.environ.get(AMQP_ENV, LOCAL_AMQP))
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"left behind by this run (a test did not remove what it "
                                f"made): {', '.join(left)}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
