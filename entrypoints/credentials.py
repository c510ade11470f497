"""What the production profile refuses of the settings' credentials: RabbitMQ's guest account,
a PostgreSQL DSN without a credential of its own, a callee's bearer token sent in clear."""

from __future__ import annotations

import os
from typing import Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

from entrypoints.setting_groups import HttpSettings, PostgresSettings, ProductionSettings

#: RabbitMQ's default account, user and password; aio-pika sends it for a user or a password
#: the AMQP URL leaves out.
GUEST = "guest"


def guest_credentials(amqp_url: str) -> str | None:
    """Why `amqp_url` logs in to RabbitMQ with its default account `guest` (as user or as
    password; aio-pika sends it for a user or password the URL leaves out), or None when it
    does not: it names a user and a password of their own, or logs in with a client
    certificate (`amqps://...?auth=external&certfile=...`, RabbitMQ's EXTERNAL mechanism).
    The reason never quotes the URL."""
    parts = urlsplit(amqp_url)
    query = {k.lower(): v for k, v in parse_qsl(parts.query)}
    if (parts.scheme.lower() == "amqps" and query.get("auth", "").lower() == "external"
            and query.get("certfile")):
        return None
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    if not user:
        return "no user: the client logs in as guest, RabbitMQ's default account"
    if user == GUEST:
        return "the user is guest, RabbitMQ's default account"
    if not password:
        return "no password: the client sends guest's, RabbitMQ's default one"
    if password == GUEST:
        return "the password is guest's, RabbitMQ's default one"
    return None


def authenticates(dsn: str) -> bool:
    """Whether a PostgreSQL `dsn` brings a credential of its own: a password (in the URL's
    user part, a `password=` or `passfile=` parameter, or libpq's PGPASSWORD / PGPASSFILE
    in this process's environment, which asyncpg reads when the DSN has none), or a client
    certificate (`sslcert=`, or PGSSLCERT) with the server's identity checked
    (`sslmode=verify-full`, or PGSSLMODE). Trust and peer authentication, and a password
    found in the default ~/.pgpass, are none of these."""
    parts = urlsplit(dsn)
    query = {k.lower(): v for k, v in parse_qsl(parts.query)}
    if parts.password or query.get("password") or query.get("passfile"):
        return True
    if os.environ.get("PGPASSWORD") or os.environ.get("PGPASSFILE"):
        return True
    certificate = query.get("sslcert") or os.environ.get("PGSSLCERT")
    mode = query.get("sslmode") or os.environ.get("PGSSLMODE")
    return bool(certificate) and mode == "verify-full"


class Credentials(Protocol):
    """What of the settings (`entrypoints.settings.Settings`) carries a credential, and
    which weak ones they allow."""

    @property
    def production(self) -> ProductionSettings: ...
    @property
    def postgres(self) -> PostgresSettings: ...
    @property
    def http(self) -> HttpSettings: ...
    def amqp(self) -> str: ...


def production_credentials(settings: Credentials) -> None:
    """Raise ValueError ("<field>: ...") for the first weak credential or clear-text
    bearer token of the production configuration `settings` that no `allow_...` setting
    allows. The message names the setting that would allow it, never the URL (it may hold
    a password)."""
    if not settings.production.allow_guest_broker_credentials:
        weak = guest_credentials(settings.amqp())
        if weak:
            raise ValueError(f"amqp_url: {weak}: refused by the production profile (give "
                             "the service a RabbitMQ user of its own, deploy/rabbitmq/"
                             "setup.sh), unless EO_ALLOW_GUEST_BROKER_CREDENTIALS=true")
    if not settings.production.allow_passwordless_dsn:
        for name in ("database_dsn", "token_dsn"):
            dsn = getattr(settings.postgres, name)
            if dsn is not None and not authenticates(dsn.get_secret_value()):
                raise ValueError(
                    f"{name}: no password (in the URL, a password= or passfile= "
                    "parameter, PGPASSWORD or PGPASSFILE) and no client certificate "
                    "(sslcert= with sslmode=verify-full): refused by the production "
                    "profile, unless EO_ALLOW_PASSWORDLESS_DSN=true (trust or peer "
                    "authentication, a password in ~/.pgpass)")
    for name, callee in settings.http.callees.items():
        scheme = urlsplit(callee.url).scheme.lower() if callee.url else "https"
        if scheme == "http" and not settings.production.allow_plain_http_callees:
            raise ValueError(f"callees__{name}__url: http:// sends the callee's bearer "
                             "token in clear: use https://; refused by the production "
                             "profile unless EO_ALLOW_PLAIN_HTTP_CALLEES=true")
        if scheme not in ("http", "https"):
            raise ValueError(f"callees__{name}__url: a callee is called over https:// "
                             "(http:// only with EO_ALLOW_PLAIN_HTTP_CALLEES=true)")
