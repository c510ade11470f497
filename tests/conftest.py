"""The whole suite's guard: tests touch only what they create, and remove it."""

from __future__ import annotations

import os

import pytest

from tests.support.processes import leftovers
from tests.support.services import AMQP_ENV, LOCAL_AMQP, LOCAL_POSTGRES, POSTGRES_ENV
from tests.support.spark import spark  # noqa: F401 - the pipeline tests' Spark session


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
