"""Failpoint specs (protocol 10) and settings from the environment (`EO_` variables)."""

from __future__ import annotations

import asyncio
import os
import time
from decimal import Decimal
from pathlib import Path

import pytest

from application.errors import TransientError
from application.failpoints import Failpoints, Rule, parse
from application.processor import Strategy
from entrypoints.settings import Settings, SettingsError, load_settings

# --- failpoints ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            "after_token_load=crash",
            {"after_token_load": Rule("after_token_load", "crash", None, 0)},
        ),
        ("after_commit=sleep:5@2", {"after_commit": Rule("after_commit", "sleep:5", "@", 2)}),
        ("after_publish:3=raise*2", {"after_publish:3": Rule("after_publish:3", "raise", "*", 2)}),
        ("before_ack=drop_conn", {"before_ack": Rule("before_ack", "drop_conn", None, 0)}),
        (
            "callee.after_commit=crash@1",
            {"callee.after_commit": Rule("callee.after_commit", "crash", "@", 1)},
        ),
        (
            "after_register:blob=crash;after_create:message=raise",
            {
                "after_register:blob": Rule("after_register:blob", "crash", None, 0),
                "after_create:message": Rule("after_create:message", "raise", None, 0),
            },
        ),
        (
            " after_put=raise ; ; before_delete=sleep:0 ",
            {
                "after_put": Rule("after_put", "raise", None, 0),
                "before_delete": Rule("before_delete", "sleep:0", None, 0),
            },
        ),
        ("", {}),
    ],
)
def test_parse_accepts_valid_specs(spec: str, expected: dict[str, Rule]) -> None:
    assert parse(spec) == expected


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("after_commit", "'after_commit'"),
        ("after_commit=explode", "'after_commit=explode'"),
        ("after_commit=crash@", "'after_commit=crash@'"),
        ("after_commit=crash@two", "'after_commit=crash@two'"),
        ("after_commit=crash*2@3", "'after_commit=crash*2@3'"),
        ("after_commit=sleep", "'after_commit=sleep'"),
        ("after_commit=sleep:5ms", "'after_commit=sleep:5ms'"),
        ("=crash", "'=crash'"),
        ("before_ack=raise;after_comit=crash", "'after_comit'"),
        ("a=crash", "'a'"),
        ("callee.after_put=crash", "'callee.after_put'"),
        ("before_ack=raise;oops", "'oops'"),
    ],
)
def test_parse_refuses_bad_rules_and_unknown_names_naming_them(spec: str, named: str) -> None:
    with pytest.raises(ValueError, match="EO_FAILPOINTS") as caught:
        parse(spec)
    assert named in str(caught.value)


@pytest.mark.parametrize("spec", [None, "", "   "])
def test_no_spec_means_no_failpoints(spec: str | None) -> None:
    assert Failpoints.from_spec(spec, _no_crash) is None


def _no_crash(name: str) -> None:
    raise AssertionError(f"unexpected crash at {name}")


async def _fires(fp: Failpoints, name: str) -> bool:
    try:
        await fp.hit(name)
    except TransientError:
        return True
    return False


async def test_at_n_fires_on_the_nth_hit_only() -> None:
    fp = Failpoints.from_spec("before_commit=raise@2", _no_crash)
    assert fp is not None
    assert [await _fires(fp, "before_commit") for _ in range(4)] == [False, True, False, False]
    assert fp.hits["before_commit"] == 4
    assert fp.fired["before_commit"] == 1


async def test_star_n_fires_on_each_of_the_first_n_hits() -> None:
    fp = Failpoints.from_spec("before_commit=raise*2", _no_crash)
    assert fp is not None
    assert [await _fires(fp, "before_commit") for _ in range(4)] == [True, True, False, False]
    assert fp.fired["before_commit"] == 2


async def test_without_a_mode_a_rule_fires_on_every_hit() -> None:
    fp = Failpoints.from_spec("before_commit=raise", _no_crash)
    assert fp is not None
    assert [await _fires(fp, "before_commit") for _ in range(3)] == [True, True, True]


async def test_names_are_counted_separately_and_unconfigured_names_are_ignored() -> None:
    fp = Failpoints.from_spec("after_publish:2=raise@1", _no_crash)
    assert fp is not None
    assert not await _fires(fp, "after_publish:1")
    assert not await _fires(fp, "after_commit")
    assert await _fires(fp, "after_publish:2")
    assert fp.hits["after_publish:1"] == 0  # only configured names are counted
    assert fp.hits["after_publish:2"] == 1


async def test_crash_and_drop_conn_call_their_hooks() -> None:
    crashed: list[str] = []
    dropped: list[bool] = []

    async def drop() -> None:
        dropped.append(True)

    fp = Failpoints.from_spec("after_commit=crash@2;before_ack=drop_conn", crashed.append, drop)
    assert fp is not None
    await fp.hit("after_commit")
    assert crashed == []
    await fp.hit("after_commit")
    assert crashed == ["after_commit"]
    await fp.hit("before_ack")
    assert dropped == [True]


async def test_drop_conn_without_a_hook_is_a_no_op() -> None:
    fp = Failpoints.from_spec("before_ack=drop_conn", _no_crash)
    assert fp is not None
    await fp.hit("before_ack")
    assert fp.fired["before_ack"] == 1


async def test_sleep_waits_the_given_milliseconds() -> None:
    fp = Failpoints.from_spec("after_commit=sleep:30@2", _no_crash)
    assert fp is not None
    started = time.monotonic()
    await fp.hit("after_commit")
    assert time.monotonic() - started < 0.02
    started = time.monotonic()
    await fp.hit("after_commit")
    assert time.monotonic() - started >= 0.025


async def test_sleep_lets_other_tasks_run() -> None:
    fp = Failpoints.from_spec("after_commit=sleep:10", _no_crash)
    assert fp is not None
    ran = asyncio.Event()

    async def other() -> None:
        ran.set()

    task = asyncio.create_task(other())
    await fp.hit("after_commit")
    assert ran.is_set()
    await task


async def test_scoped_view_prefixes_names_and_shares_counters() -> None:
    crashed: list[str] = []
    fp = Failpoints.from_spec("callee.after_commit=crash@2;after_commit=raise", crashed.append)
    assert fp is not None
    callee = fp.scoped("callee.")
    await callee.hit("after_commit")  # hit 1 of callee.after_commit: no crash, no raise
    assert crashed == []
    assert fp.hits["callee.after_commit"] == 1
    assert await _fires(fp, "after_commit")  # the unscoped rule is another name
    await callee.hit("after_commit")
    assert crashed == ["callee.after_commit"]
    assert fp.fired == {"callee.after_commit": 1, "after_commit": 1}
    assert callee.hits is fp.hits
    assert not await _fires(callee, "before_ack")


async def test_each_firing_is_reported_before_its_action_also_through_scoped_views() -> None:
    log: list[tuple[str, str]] = []

    def crash(name: str) -> None:
        log.append(("crashed", name))

    fp = Failpoints.from_spec("after_commit=crash@2;callee.before_reply=raise", crash,
                              on_fire=lambda name, action: log.append((name, action)))
    assert fp is not None
    await fp.hit("after_commit")  # hit 1: does not fire, not reported
    await fp.hit("after_commit")
    with pytest.raises(TransientError):
        await fp.scoped("callee.").hit("before_reply")
    assert log == [("after_commit", "crash"), ("crashed", "after_commit"),
                   ("callee.before_reply", "raise")]


# --- settings ------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No `EO_` variable of the developer's shell leaks in, and no `.env` file is read."""
    for name in list(os.environ):
        if name.upper().startswith("EO_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def test_defaults() -> None:
    settings = load_settings()
    assert settings.profile == "embedded"
    assert settings.failpoints == ""
    assert settings.strategies == {
        "gateway": Strategy.OUTBOX,
        "orders": Strategy.TOKEN,
        "ledger": Strategy.TOKEN,
    }
    assert settings.strategy("gateway") is Strategy.OUTBOX
    assert settings.strategy("orders") is Strategy.TOKEN
    assert settings.strategy("anything-else") is Strategy.TOKEN
    assert settings.conflict_retries == 3
    assert settings.max_attempts == 5
    assert settings.retry_delays_s == (0.05, 0.2, 1.0, 5.0)
    assert settings.prefetch == 8
    assert settings.retention_days == 7.0
    assert settings.cleanup_grace_s == 1800.0
    assert settings.credit_limit == Decimal("1000000")
    assert settings.blob_dir == Path("var/blobs")


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_STRATEGIES", '{"gateway": "outbox", "ledger": "outbox"}')
    monkeypatch.setenv("EO_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("EO_RETRY_DELAYS_S", "[0.5, 1.5]")
    monkeypatch.setenv("EO_FAILPOINTS", "after_commit=crash@3")
    monkeypatch.setenv("EO_CREDIT_LIMIT", "250.50")
    settings = load_settings()
    assert settings.strategy("ledger") is Strategy.OUTBOX
    assert settings.strategy("gateway") is Strategy.OUTBOX
    assert settings.strategy("orders") is Strategy.TOKEN
    assert settings.max_attempts == 2
    assert settings.retry_delays_s == (0.5, 1.5)
    assert settings.failpoints == "after_commit=crash@3"
    assert settings.credit_limit == Decimal("250.50")


def test_keyword_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_MAX_ATTEMPTS", "2")
    assert load_settings(max_attempts=9).max_attempts == 9


def test_overriding_one_endpoints_strategy_keeps_the_gateway_on_outbox(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EO_STRATEGIES", '{"ledger": "outbox"}')
    settings = load_settings()
    assert settings.strategy("ledger") is Strategy.OUTBOX
    assert settings.strategy("gateway") is Strategy.OUTBOX


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EO_STRATEGIES", '{"gateway": "token"}'),
        ("EO_STRATEGIES", '{"orders": "exactly-once"}'),
        ("EO_FAILPOINTS", "after_commit=explode"),
        ("EO_FAILPOINTS", "no_such_point=crash"),
        ("EO_MAX_ATTEMPTS", "0"),
        ("EO_MAX_ATTEMPTS", "many"),
        ("EO_PREFETCH", "0"),
        ("EO_RETRY_DELAYS_S", "[]"),
        ("EO_RETRY_DELAYS_S", "[1, -1]"),
        ("EO_PROFILE", "staging"),
        ("EO_CLEANUP_GRACE_S", "0"),
    ],
)
def test_an_invalid_setting_raises_settings_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert f"invalid setting {variable}:" in str(caught.value)


@pytest.mark.parametrize("variable", ["EO_STRATEGIES", "EO_RETRY_DELAYS_S"])
def test_a_complex_setting_that_is_not_json_raises_settings_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "not json")
    with pytest.raises(SettingsError, match=f"invalid setting {variable}:"):
        load_settings()


def test_the_gateway_must_be_outbox_and_the_message_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EO_STRATEGIES", '{"gateway": "token", "orders": "token"}')
    with pytest.raises(SettingsError, match="EO_STRATEGIES") as caught:
        load_settings()
    assert "gateway must use 'outbox'" in str(caught.value)


def test_an_invalid_failpoint_message_names_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_FAILPOINTS", "before_ack=raise;after_comit=crash")
    with pytest.raises(SettingsError, match="EO_FAILPOINTS") as caught:
        load_settings()
    assert "after_comit" in str(caught.value)


def test_settings_is_the_type_load_settings_returns() -> None:
    assert isinstance(load_settings(max_attempts=1), Settings)
