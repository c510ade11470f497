"""The production profile refuses weak credentials and plain HTTP at start-up (issue 24): the
broker's guest account, a PostgreSQL DSN that authenticates with nothing, a callee's bearer
token sent over http://; each unless its own `EO_ALLOW_...` setting allows it. The message
names the wrong variable and the one that allows it, and never shows a secret."""

from __future__ import annotations

import os

import pytest

from entrypoints.settings import SettingsError, load_settings

DSN = "postgresql://eo_app:db-pass-4711@db:5432/eo"
AMQP = "amqp://eo-service:mq-pass-4711@mq:5672/eo"
PRODUCTION = {"profile": "production", "database_dsn": DSN, "amqp_url": AMQP}
#: every secret the tests' settings hold: none may appear in a message
SECRETS = ("db-pass-4711", "mq-pass-4711", "key-pass-4711", "tok-4711", "url-pass-4711")


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what a test sets: no `EO_` variable, no libpq password or certificate variable."""
    for name in list(os.environ):
        if name.upper().startswith("EO_") or name.upper() in (
                "PGPASSWORD", "PGPASSFILE", "PGSSLCERT", "PGSSLMODE"):
            monkeypatch.delenv(name)


def _refused(**overrides: object) -> str:
    """The message of the `SettingsError` that loading `overrides` over a valid production
    configuration raises; fails when none is raised or it shows a secret."""
    with pytest.raises(SettingsError) as caught:
        load_settings(**{**PRODUCTION, **overrides})
    message = str(caught.value)
    # nor in the validation error it comes from (a traceback prints it)
    assert not [s for s in SECRETS if s in f"{message} {caught.value.__cause__}"], message
    return message


def test_a_production_configuration_with_passwords_and_https_loads() -> None:
    settings = load_settings(**PRODUCTION, callees={
        "payments": {"url": "https://payments.internal:8443", "token": "tok-4711"}})
    assert settings.amqp() == AMQP
    assert not settings.production.allow_guest_broker_credentials
    assert not settings.production.allow_passwordless_dsn
    assert not settings.production.allow_plain_http_callees


# --- the broker: RabbitMQ's guest account ----------------------------------------------------


@pytest.mark.parametrize(("url", "reason"), [
    ("amqp://guest:mq-pass-4711@mq:5672/eo", "guest"),
    ("amqp://guest:guest@mq:5672/", "guest"),
    ("amqp://mq:5672/eo", "no user"),  # aio-pika logs in as guest then
    ("amqp://eo-service@mq:5672/eo", "no password"),  # ... and sends guest's password
    ("amqp://eo-service:@mq:5672/eo", "no password"),
    ("amqps://eo-service:guest@mq:5671/eo", "guest"),
])
def test_the_brokers_guest_credentials_are_refused(url: str, reason: str) -> None:
    message = _refused(amqp_url=url)
    assert message.startswith("invalid setting EO_AMQP_URL: ")
    assert reason in message
    assert "EO_ALLOW_GUEST_BROKER_CREDENTIALS" in message
    assert url not in message


@pytest.mark.parametrize("url", ["amqp://guest:guest@mq:5672/", "amqp://mq:5672/eo",
                                 "amqp://eo-service@mq:5672/eo"])
def test_eo_allow_guest_broker_credentials_allows_them(url: str) -> None:
    assert load_settings(**{**PRODUCTION, "amqp_url": url},
                         allow_guest_broker_credentials=True).amqp() == url


def test_a_client_certificate_logs_in_to_the_broker_without_a_password() -> None:
    """RabbitMQ's EXTERNAL mechanism over TLS: the certificate is the credential."""
    url = "amqps://mq:5671/eo?auth=external&certfile=/run/eo/client.pem&keyfile=/run/eo/key.pem"
    assert load_settings(**{**PRODUCTION, "amqp_url": url}).amqp() == url
    _refused(amqp_url="amqp://mq:5672/eo?auth=external")  # no certificate, no TLS: guest


# --- PostgreSQL: a DSN that authenticates with nothing ---------------------------------------


@pytest.mark.parametrize("field", ["database_dsn", "token_dsn"])
@pytest.mark.parametrize("dsn", [
    "postgresql://eo_app@db:5432/eo",
    "postgresql://eo_app:@db:5432/eo",  # an empty password is none
    "postgresql://db/eo?sslmode=verify-full",
    "postgresql://eo_app@db/eo?sslcert=/run/eo/client.crt&sslmode=require",  # server unchecked
    "postgresql://eo_app@db/eo?sslpassword=key-pass-4711&sslmode=verify-full",  # no cert
])
def test_a_dsn_without_a_password_or_client_certificate_is_refused(field: str, dsn: str
                                                                   ) -> None:
    message = _refused(**{field: dsn})
    assert message.startswith(f"invalid setting EO_{field.upper()}: ")
    assert "EO_ALLOW_PASSWORDLESS_DSN" in message
    assert dsn not in message


@pytest.mark.parametrize("dsn", [
    "postgresql://eo_app@db/eo?password=db-pass-4711",
    "postgresql://eo_app@db/eo?passfile=/run/secrets/pgpass",
    "postgres://eo_app@db/eo?sslcert=/run/eo/client.crt&sslkey=/run/eo/client.key"
    "&sslmode=verify-full",
])
def test_a_dsn_with_a_password_source_or_a_client_certificate_loads(dsn: str) -> None:
    assert load_settings(**{**PRODUCTION, "database_dsn": dsn}).database() == dsn


@pytest.mark.parametrize("variable", ["PGPASSWORD", "PGPASSFILE"])
def test_libpqs_password_variables_count_as_a_password(monkeypatch: pytest.MonkeyPatch,
                                                       variable: str) -> None:
    """asyncpg (as libpq) takes the password from PGPASSWORD or the file PGPASSFILE names
    when the DSN has none."""
    monkeypatch.setenv(variable, "db-pass-4711" if variable == "PGPASSWORD" else "/pgpass")
    load_settings(**{**PRODUCTION, "database_dsn": "postgresql://eo_app@db/eo"})


def test_eo_allow_passwordless_dsn_allows_trust_or_peer_authentication() -> None:
    dsn = "postgresql://eo_app@/eo?host=/var/run/postgresql"
    settings = load_settings(**{**PRODUCTION, "database_dsn": dsn, "token_dsn": dsn},
                             allow_passwordless_dsn=True)
    assert settings.tokens_database() == dsn


# --- HTTP callees: the bearer token in clear -------------------------------------------------


@pytest.mark.parametrize("url", ["http://payments:8470", "HTTP://payments:8470",
                                 "http://user:url-pass-4711@payments:8470"])
def test_a_callee_over_plain_http_is_refused(url: str) -> None:
    message = _refused(callees={"payments": {"url": url, "token": "tok-4711"}})
    assert message.startswith("invalid setting EO_CALLEES__PAYMENTS__URL: ")
    assert "EO_ALLOW_PLAIN_HTTP_CALLEES" in message
    assert "https" in message


def test_a_callee_url_that_is_no_http_url_is_refused_even_when_http_is_allowed() -> None:
    with pytest.raises(SettingsError, match=r"EO_CALLEES__PAYMENTS__URL: .*https"):
        load_settings(**PRODUCTION, allow_plain_http_callees=True,
                      callees={"payments": {"url": "ftp://payments", "token": "tok-4711"}})


def test_eo_allow_plain_http_callees_allows_them() -> None:
    settings = load_settings(**PRODUCTION, allow_plain_http_callees=True,
                             callees={"payments": {"url": "http://payments:8470",
                                                   "token": "tok-4711"}})
    assert settings.callee("payments").url == "http://payments:8470"


# --- from the environment, and the other profiles --------------------------------------------


def test_the_variables_are_read_and_named_from_the_environment(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {"EO_PROFILE": "production", "EO_DATABASE_DSN": DSN,
                        "EO_AMQP_URL": "amqp://guest:mq-pass-4711@mq/eo",
                        "EO_CALLEES__PAYMENTS__URL": "http://payments:8470",
                        "EO_CALLEES__PAYMENTS__TOKEN": "tok-4711"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=r"EO_AMQP_URL: .*EO_ALLOW_GUEST_BROKER_CREDENTIALS"):
        load_settings()
    monkeypatch.setenv("EO_ALLOW_GUEST_BROKER_CREDENTIALS", "true")
    with pytest.raises(SettingsError, match=r"EO_CALLEES__PAYMENTS__URL: .*EO_ALLOW_PLAIN_HTTP"):
        load_settings()
    monkeypatch.setenv("EO_ALLOW_PLAIN_HTTP_CALLEES", "true")
    monkeypatch.setenv("EO_TOKEN_DSN", "postgresql://eo_app@db/tokens")
    with pytest.raises(SettingsError, match=r"EO_TOKEN_DSN: .*EO_ALLOW_PASSWORDLESS_DSN"):
        load_settings()
    monkeypatch.setenv("EO_ALLOW_PASSWORDLESS_DSN", "1")
    assert load_settings().profile == "production"


@pytest.mark.parametrize("profile", ["embedded", "local"])
def test_the_embedded_and_local_profiles_accept_all_of_it(profile: str) -> None:
    """Their defaults are guest on localhost and a passwordless local DSN."""
    settings = load_settings(profile=profile, callees={
        "payments": {"url": "http://127.0.0.1:8470", "token": "tok-4711"}})
    assert settings.amqp() == "amqp://guest:guest@127.0.0.1:5672/"
    assert settings.database() == "postgresql://postgres@127.0.0.1:5432/eo"
    load_settings(profile=profile, amqp_url="amqp://127.0.0.1/",
                  database_dsn="postgresql://postgres@127.0.0.1/eo")
