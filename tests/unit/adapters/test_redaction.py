"""DSNs as they may be logged or written down (security review, a Low finding: a password
in a DSN's query string went to the audit's summary.json)."""

from __future__ import annotations

import pytest

from adapters.postgres.admin import redacted_dsn


@pytest.mark.parametrize(("dsn", "shown"), [
    ("postgresql://eo:s3cret@db:5432/eo", "postgresql://eo:***@db:5432/eo"),
    ("postgresql://eo@db/eo?password=s3cret&sslmode=require",
     "postgresql://eo@db/eo?password=***&sslmode=require"),
    ("postgresql://db/eo?sslpassword=s3cret&PASSWORD=s3cret",
     "postgresql://db/eo?sslpassword=***&PASSWORD=***"),
    ("postgresql://eo@db/eo", "postgresql://eo@db/eo"),
])
def test_a_dsn_is_shown_without_its_passwords(dsn: str, shown: str) -> None:
    assert redacted_dsn(dsn) == shown
    assert "s3cret" not in redacted_dsn(dsn)
