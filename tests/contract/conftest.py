"""Drops this run's contract database (tests/contract/adapters.py) when the session ends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from adapters.postgres.admin import drop_database, with_database
from tests.contract.adapters import DATABASE
from tests.support.services import ServiceUnavailable, discover


@pytest.fixture(scope="session", autouse=True)
def _drop_the_contract_database() -> Iterator[None]:
    yield
    try:
        services = discover(rabbitmq=False)
    except ServiceUnavailable:
        return
    try:
        asyncio.run(drop_database(with_database(services.postgres_dsn, DATABASE)))
    finally:
        services.close()
