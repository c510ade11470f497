"""Failpoint specs (protocol 10) and settings from the environment (`EO_` variables),
checked against the service's registry (the counters service: `front`, `counter`, `audit`,
`bank`)."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest

from application.errors import TransientError
from application.failpoints import Failpoints, Rule, parse
from application.registry import Registration, Registry
from application.strategy import Strategy
from entrypoints.service_spec import resolve_service
from entrypoints.settings import (
    DEFAULT_SERVICE,
    Settings,
    SettingsError,
    load_settings,
    setting_names,
)
from tests.support.counters.endpoints import AUDIT
from tests.support.counters.registry import REGISTRY, SPEC
from tests.support.set_algebra import SET_ALGEBRA

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
        ("after_commit=wait:b-done@1",
         {"after_commit": Rule("after_commit", "wait:b-done", "@", 1)}),
        ("", {}),
    ],
)
def test_parse_accepts_valid_specs(spec: str, expected: dict[str, Rule]) -> None:
    assert parse(spec) == expected


@pytest.mark.parametrize("name", ["after_state_load", "before_append", "after_append"])
def test_the_state_paths_failpoints_are_accepted(name: str) -> None:
    assert parse(f"{name}=crash") == {name: Rule(name, "crash", None, 0)}


def test_every_failpoint_the_code_hits_is_a_name_eo_failpoints_accepts() -> None:
    """A failpoint hit in the code but unknown to `parse` could never be configured."""
    root = Path(__file__).resolve().parents[2]
    hit = re.compile(r"""\bhit\(f?["']([a-z_.:]+)""")
    found = {("callee." if path.name == "http_callee.py" else "") + name  # a scoped view
             for folder in ("application", "adapters", "entrypoints")
             for path in (root / folder).rglob("*.py")
             for name in hit.findall(path.read_text())}
    assert len(found) >= 15, found  # the scan found the hits
    for name in found:
        spec = f"{name}x=crash" if name.endswith(":") else f"{name}=crash"
        assert parse(spec), name


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
        ("after_commit=wait", "'after_commit=wait'"),
        ("after_commit=wait:../up", "'after_commit=wait:../up'"),
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
    await fp.hit("after_commit")
    assert fp.fired["after_commit"] == 0  # hit 1: the rule (@2) does not fire, nor sleep
    started = time.monotonic()
    await fp.hit("after_commit")
    assert fp.fired["after_commit"] == 1
    assert time.monotonic() - started >= 0.025  # at least the 30 ms (load only adds)


async def test_wait_pauses_until_its_gate_file_exists(tmp_path: Path) -> None:
    fp = Failpoints.from_spec("after_commit=wait:b-done@2", _no_crash, gates=tmp_path)
    assert fp is not None
    await asyncio.wait_for(fp.hit("after_commit"), 1)  # hit 1: the rule does not fire
    paused = asyncio.create_task(fp.hit("after_commit"))
    await asyncio.sleep(0.2)
    assert not paused.done()  # no gate yet, however long it takes
    (tmp_path / "b-done").touch()
    await asyncio.wait_for(paused, 1)
    assert fp.fired["after_commit"] == 1


def test_a_wait_without_a_gates_directory_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="EO_FAILPOINT_GATES"):
        Failpoints.from_spec("after_commit=wait:b-done", _no_crash)
    with pytest.raises(SettingsError, match="EO_FAILPOINT_GATES"):
        load_settings(failpoints="after_commit=wait:b-done")
    assert load_settings(failpoints="after_commit=wait:b-done",
                         failpoint_gates=Path("/tmp")).faults.failpoint_gates == Path("/tmp")


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
    assert settings.service == DEFAULT_SERVICE
    assert settings.faults.failpoints == ""
    assert settings.strategies == {}  # no override: the registry's defaults
    assert settings.http.callees == {}
    assert settings.operator.metrics_port is None  # the first free status port from 9464
    assert settings.protocol.conflict_retries == 3
    assert settings.protocol.max_attempts == 5
    assert settings.protocol.retry_delays_s == (0.05, 0.2, 1.0, 5.0)
    protocol = settings.protocol
    assert (protocol.batch_size, protocol.batch_wait_ms, protocol.prefetch) == (50, 0.0, None)
    # the prefetch is the endpoint's: two batches in process and one waiting, or 8
    assert (settings.prefetch_for(batches=True), settings.prefetch_for(batches=False)) == (
        150, 8)
    assert settings.protocol.retention_days == 7.0
    assert settings.protocol.cleanup_grace_s == 1800.0
    assert settings.blobs.blob_dir == Path("var/blobs")
    assert resolve_service(settings, REGISTRY).strategies == {
        "front": Strategy.OUTBOX,  # a gateway
        "counter": Strategy.TOKEN,
        "audit": Strategy.TOKEN,
        "bank": Strategy.TOKEN,  # a callee
    }


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_STRATEGIES", '{"front": "outbox", "audit": "outbox"}')
    monkeypatch.setenv("EO_MAX_ATTEMPTS", "2")
    monkeypatch.setenv("EO_RETRY_DELAYS_S", "[0.5, 1.5]")
    monkeypatch.setenv("EO_FAILPOINTS", "after_commit=crash@3")
    monkeypatch.setenv("EO_METRICS_PORT", "0")
    settings = load_settings()
    service = resolve_service(settings, REGISTRY)
    assert service.strategy("audit") is Strategy.OUTBOX
    assert service.strategy("front") is Strategy.OUTBOX
    assert service.strategy("counter") is Strategy.TOKEN
    assert settings.protocol.max_attempts == 2
    assert settings.protocol.retry_delays_s == (0.5, 1.5)
    assert settings.faults.failpoints == "after_commit=crash@3"
    assert settings.operator.metrics_port == 0


def test_keyword_overrides_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_MAX_ATTEMPTS", "2")
    assert load_settings(max_attempts=9).protocol.max_attempts == 9


def test_overriding_one_endpoints_strategy_keeps_the_others_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EO_STRATEGIES", '{"audit": "state"}')
    service = resolve_service(load_settings(), REGISTRY)
    assert service.strategy("audit") is Strategy.STATE
    assert service.strategy("front") is Strategy.OUTBOX
    assert service.strategy("counter") is Strategy.TOKEN


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("EO_FAILPOINTS", "after_commit=explode"),
        ("EO_FAILPOINTS", "no_such_point=crash"),
        ("EO_MAX_ATTEMPTS", "0"),
        ("EO_MAX_ATTEMPTS", "many"),
        ("EO_PREFETCH", "0"),
        ("EO_BATCH_SIZE", "0"),
        ("EO_BATCH_WAIT_MS", "-1"),
        ("EO_RETRY_DELAYS_S", "[]"),
        ("EO_RETRY_DELAYS_S", "[1, -1]"),
        ("EO_PROFILE", "staging"),
        ("EO_CLEANUP_GRACE_S", "0"),
        ("EO_METRICS_PORT", "65536"),
        ("EO_SERVICE", "no-colon"),
        ("EO_AMQP_ADDRESSES", '["rabbit-1"]'),
        ("EO_AMQP_ADDRESSES", '["rabbit-1:port"]'),
        ("EO_AMQP_ADDRESSES", '["rabbit-1:70000"]'),
    ],
)
def test_an_invalid_setting_raises_settings_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert f"invalid setting {variable}:" in str(caught.value)


def test_the_prefetch_follows_the_batch_size_unless_it_is_set(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EO_PREFETCH", "9")  # a prefetch alone: batches of a third of it
    assert (load_settings().protocol.batch_size, load_settings().protocol.prefetch) == (3, 9)
    # ... and every endpoint has it, batching or not
    assert {load_settings().prefetch_for(batches) for batches in (True, False)} == {9}
    monkeypatch.setenv("EO_PREFETCH", "1")
    assert load_settings().protocol.batch_size == 1  # batching off
    monkeypatch.delenv("EO_PREFETCH")
    monkeypatch.setenv("EO_BATCH_SIZE", "32")
    # two batches in process, the next one filling; one delivery at a time: 8
    assert (load_settings().prefetch_for(True), load_settings().prefetch_for(False)) == (96, 8)
    monkeypatch.setenv("EO_BATCH_SIZE", "2")  # below 8 / 3: still three batches
    assert load_settings().prefetch_for(True) == 6
    monkeypatch.setenv("EO_BATCH_SIZE", "32")
    monkeypatch.setenv("EO_PREFETCH", "40")
    assert load_settings().prefetch_for(True) == 40
    monkeypatch.setenv("EO_PREFETCH", "16")  # a batch could never fill
    with pytest.raises(SettingsError, match="invalid setting EO_BATCH_SIZE: 32 exceeds "
                                            "prefetch 16"):
        load_settings()


@pytest.mark.parametrize("variable", ["EO_STRATEGIES", "EO_RETRY_DELAYS_S", "EO_CALLEES"])
def test_a_complex_setting_that_is_not_json_raises_settings_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str
) -> None:
    monkeypatch.setenv(variable, "not json")
    with pytest.raises(SettingsError, match=f"invalid setting {variable}:"):
        load_settings()


def test_an_unknown_strategy_name_names_the_endpoints_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EO_STRATEGIES", '{"counter": "exactly-once"}')
    with pytest.raises(SettingsError, match="invalid setting EO_STRATEGIES__COUNTER:") as caught:
        load_settings()
    assert "'token', 'outbox' or 'state'" in str(caught.value)


# --- strategies checked against the registry ------------------------------------------------


@pytest.mark.parametrize(
    ("strategies", "reason"),
    [
        ('{"front": "token"}', "front: a gateway uses 'outbox'"),
        ('{"front": "state"}', "front: a gateway uses 'outbox'"),
        ('{"bank": "outbox"}', "bank: a callee uses 'token'"),
        ('{"counter": "state"}', "counter=state: it creates blobs, calls HTTP callees"),
        ('{"counter": "state"}', "counter=state sends to audit, which uses 'token'"),
        ('{"nope": "outbox"}', "nope: no such endpoint (the service has ['front', 'counter', "
                               "'audit', 'bank'])"),
    ],
)
def test_a_strategy_the_registry_refuses_names_eo_strategies_and_the_endpoint(
    monkeypatch: pytest.MonkeyPatch, strategies: str, reason: str
) -> None:
    monkeypatch.setenv("EO_STRATEGIES", strategies)
    settings = load_settings()  # the setting itself is well formed...
    with pytest.raises(SettingsError, match="invalid setting EO_STRATEGIES:") as caught:
        resolve_service(settings, REGISTRY)  # ...but this service cannot run it
    assert reason in str(caught.value)


def test_state_is_refused_for_an_endpoint_sending_to_a_token_receiver() -> None:
    sets = Registry("sets", (Registration(SET_ALGEBRA), Registration(AUDIT)))
    with pytest.raises(SettingsError, match="invalid setting EO_STRATEGIES:") as caught:
        resolve_service(load_settings(strategies={"sets": "state"}), sets)
    assert "sets=state sends to audit, which uses 'token'" in str(caught.value)
    both = resolve_service(load_settings(strategies={"sets": "state", "audit": "outbox"}), sets)
    assert both.strategy("sets") is Strategy.STATE


# --- callees ---------------------------------------------------------------------------------


def test_callee_settings_come_from_nested_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_CALLEES__BANK__URL", "http://bank.internal:8081")
    monkeypatch.setenv("EO_CALLEES__BANK__TOKEN", "s3cret")
    monkeypatch.setenv("EO_CALLEES__BANK__HOST", "0.0.0.0")
    monkeypatch.setenv("EO_CALLEES__BANK__PORT", "8081")
    monkeypatch.setenv("EO_CALLEES__BANK__MAX_BODY_BYTES", "1024")
    settings = load_settings()
    bank = settings.callee("bank")
    assert bank.url == "http://bank.internal:8081"
    assert bank.token is not None
    assert bank.token.get_secret_value() == "s3cret"
    assert (bank.host, bank.port, bank.max_body_bytes) == ("0.0.0.0", 8081, 1024)
    assert "s3cret" not in repr(settings)  # a secret
    assert set(settings.http.callees) == {"bank"}
    assert resolve_service(settings, REGISTRY).registry is REGISTRY
    unset = settings.callee("audit")  # an endpoint without settings: the defaults
    assert (unset.url, unset.token, unset.port, unset.max_body_bytes) == (None, None, 0, 65536)


def test_a_callee_url_without_a_token_names_the_token_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EO_CALLEES__BANK__URL", "http://bank.internal:8081")
    with pytest.raises(SettingsError, match="invalid setting EO_CALLEES__BANK__TOKEN:") as caught:
        load_settings()
    assert "required when the callee's url is set" in str(caught.value)


def test_an_invalid_callee_field_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_CALLEES__BANK__PORT", "70000")
    with pytest.raises(SettingsError, match="invalid setting EO_CALLEES__BANK__PORT:"):
        load_settings()


@pytest.mark.parametrize("name", ["vault", "counter"])
def test_settings_of_a_callee_the_registry_does_not_have_name_its_variable(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setenv(f"EO_CALLEES__{name.upper()}__TOKEN", "s3cret")
    settings = load_settings()
    with pytest.raises(SettingsError, match=f"invalid setting EO_CALLEES__{name.upper()}:"
                       ) as caught:
        resolve_service(settings, REGISTRY)
    assert f"{name!r} is not a registered callee (callees: ['bank'])" in str(caught.value)


# --- the service (EO_SERVICE) ------------------------------------------------------------------


def test_eo_service_names_the_registry_to_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_SERVICE", SPEC)
    service = resolve_service(load_settings())
    assert service.registry is REGISTRY
    assert service.strategy("front") is Strategy.OUTBOX


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("no_such_module:REGISTRY", "cannot import 'no_such_module'"),
        ("tests.support.counters.registry:NOPE",
         "tests.support.counters.registry:NOPE is not a Registry"),
        ("tests.support.counters.endpoints:COUNTER",
         "tests.support.counters.endpoints:COUNTER is not a Registry"),
    ],
)
def test_an_eo_service_that_is_no_registry_names_eo_service(
    monkeypatch: pytest.MonkeyPatch, spec: str, reason: str
) -> None:
    monkeypatch.setenv("EO_SERVICE", spec)
    settings = load_settings()
    with pytest.raises(SettingsError, match="invalid setting EO_SERVICE:") as caught:
        resolve_service(settings)
    assert reason in str(caught.value)


def test_a_registry_that_cannot_run_names_eo_service(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "broken_service.py").write_text(
        "from application.registry import Registration, Registry\n"
        "from application.strategy import Strategy\n"
        "from tests.support.counters.endpoints import AUDIT\n"
        "REGISTRY = Registry('broken', (Registration(AUDIT, strategy=Strategy.STATE),\n"
        "                               Registration(AUDIT)))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("EO_SERVICE", "broken_service:REGISTRY")
    with pytest.raises(SettingsError, match="invalid setting EO_SERVICE:") as caught:
        resolve_service(load_settings())
    assert "audit: declared twice" in str(caught.value)


def test_an_invalid_failpoint_message_names_the_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_FAILPOINTS", "before_ack=raise;after_comit=crash")
    with pytest.raises(SettingsError, match="EO_FAILPOINTS") as caught:
        load_settings()
    assert "after_comit" in str(caught.value)


def test_settings_is_the_type_load_settings_returns() -> None:
    assert isinstance(load_settings(max_attempts=1), Settings)


def test_every_setting_is_documented_in_the_configuration_page() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [f"EO_{name.upper()}" for name in setting_names(Settings)
               if f"`EO_{name.upper()}" not in page]
    assert missing == []


def test_the_settings_are_grouped_by_job_and_keep_their_flat_variables(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EO_AMQP_URL", "amqp://svc:pw@mq/eo")
    monkeypatch.setenv("EO_MAX_ATTEMPTS", "7")
    monkeypatch.setenv("EO_KEPT_HEADERS", '["traceparent"]')
    monkeypatch.setenv("EO_CALLEES__PAYMENTS__URL", "https://payments")
    monkeypatch.setenv("EO_CALLEES__PAYMENTS__TOKEN", "t")
    monkeypatch.setenv("EO_RABBITMQ", '{"amqp_url": "amqp://other"}')  # a group is no variable
    settings = load_settings(pool_size=3)  # a keyword override takes the flat name too
    assert settings.rabbitmq.amqp_url is not None
    assert settings.rabbitmq.amqp_url.get_secret_value() == "amqp://svc:pw@mq/eo"
    assert (settings.protocol.max_attempts, settings.protocol.kept_headers) == (
        7, ("traceparent",))
    assert settings.http.callees["payments"].url == "https://payments"
    assert settings.postgres.pool_size == 3
    variables = settings.variables()  # what `eo settings` prints: flat names, secrets hidden
    assert (variables["EO_MAX_ATTEMPTS"], variables["EO_AMQP_URL"]) == (7, "**********")
    assert set(variables) == {f"EO_{name.upper()}" for name in setting_names(Settings)}
    # every field name is unique across the groups: one variable, one setting
    assert len(setting_names(Settings)) == len(set(setting_names(Settings)))


def test_replaced_puts_each_flat_name_in_its_group_and_refuses_an_unknown_one() -> None:
    settings = load_settings()
    copy = settings.replaced(max_attempts=2, profile="local", duplicate_rate=0.5)
    assert (copy.protocol.max_attempts, copy.profile, copy.faults.duplicate_rate) == (
        2, "local", 0.5)
    assert settings.protocol.max_attempts == 5  # the original is untouched
    with pytest.raises(TypeError, match="no setting named 'max_attempt'"):
        settings.replaced(max_attempt=2)
    with pytest.raises(TypeError, match="no setting named 'protocol'"):
        settings.replaced(protocol=None)


# credentials of their own: production refuses guest and passwordless DSNs
# (tests/unit/entrypoints/test_production_settings.py)
PRODUCTION = {"profile": "production", "database_dsn": "postgresql://eo_app:pw@db/eo",
              "amqp_url": "amqp://eo-service:pw@mq/eo"}


@pytest.mark.parametrize(
    ("overrides", "variable"),
    [({"failpoints": "after_commit=crash@3"}, "EO_FAILPOINTS"),
     ({"duplicate_rate": 0.1}, "EO_DUPLICATE_RATE")],
)
def test_the_production_profile_refuses_fault_injection(overrides: dict[str, object],
                                                        variable: str) -> None:
    with pytest.raises(SettingsError, match=f"{variable}: fault injection is refused"):
        load_settings(**PRODUCTION, **overrides)
    load_settings(profile="local", **overrides)  # elsewhere it is a tool like any


def test_production_names_its_bucket_when_an_endpoint_makes_blobs() -> None:
    """No global default bucket name in production (the security review: `eo-invoices` on
    AWS, anyone's): start-up stops naming EO_S3_BUCKET."""
    with pytest.raises(SettingsError, match="EO_S3_BUCKET: required by the production"):
        resolve_service(load_settings(**PRODUCTION), REGISTRY)  # counter makes blobs
    named = load_settings(**PRODUCTION, s3_bucket="acme-eo-blobs",
                          s3_expected_bucket_owner="111122223333")
    resolve_service(named, REGISTRY)
    assert named.bucket() == "acme-eo-blobs"
    assert load_settings(profile="local").bucket() == "eo-invoices"
    without_blobs = Registry(service="x", endpoints=(Registration(AUDIT),))
    resolve_service(load_settings(**PRODUCTION), without_blobs)  # no blobs, no bucket


def test_an_expected_bucket_owner_is_an_account_id() -> None:
    with pytest.raises(SettingsError, match="EO_S3_EXPECTED_BUCKET_OWNER"):
        load_settings(s3_expected_bucket_owner="acme")


def test_the_embedded_env_file_shows_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/embedded.env says every value it shows is the default: each one loads to what
    the setting is when unset (it once set EO_PREFETCH=8, which was not the default)."""
    root = Path(__file__).resolve().parents[2]
    lines = (root / "deploy" / "embedded.env").read_text().splitlines()
    shown = dict(line.split("=", 1) for line in lines if line.strip()
                 and not line.startswith("#"))
    assert {"EO_PROFILE", "EO_BATCH_SIZE", "EO_MAX_ATTEMPTS"} <= set(shown)
    for name in list(os.environ):
        if name.startswith("EO_"):
            monkeypatch.delenv(name)
    defaults = load_settings()
    for name, value in shown.items():
        monkeypatch.setenv(name, value)
        assert load_settings() == defaults, f"{name}={value} is not the default"
        monkeypatch.delenv(name)


def test_the_cluster_addresses_are_the_urls_node_by_node(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setenv("EO_AMQP_URL", "amqps://svc:pw@rabbit-0:5671/eo?heartbeat=30")
    monkeypatch.setenv("EO_AMQP_ADDRESSES", '["rabbit-1:5671", "[fd00::2]:5672"]')
    assert load_settings().amqp_urls() == [
        "amqps://svc:pw@rabbit-0:5671/eo?heartbeat=30",
        "amqps://svc:pw@rabbit-1:5671/eo?heartbeat=30",  # the URL's user, vhost, options
        "amqps://svc:pw@[fd00::2]:5672/eo?heartbeat=30"]
    monkeypatch.delenv("EO_AMQP_ADDRESSES")
    assert load_settings().amqp_urls() == ["amqps://svc:pw@rabbit-0:5671/eo?heartbeat=30"]
