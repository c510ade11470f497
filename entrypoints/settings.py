"""Settings from the environment (prefix `EO_`), validated at start-up."""

from __future__ import annotations

import re
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from application.failpoints import parse
from application.processor import Strategy
from application.state_based import state_wiring_errors
from domain.decisions import Endpoint
from domain.sample import LEDGER, ORDERS
from domain.sample.gateway import GATEWAY

Profile = Literal["embedded", "local", "production"]
LOCAL_DATABASE = "postgresql://postgres@127.0.0.1:5432/eo"
LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672/"
DEFAULT_STRATEGIES = {"gateway": Strategy.OUTBOX, "orders": Strategy.TOKEN,
                      "ledger": Strategy.TOKEN}
#: The sample's endpoints as the state-strategy check sees them (who sends to whom).
SAMPLE_ENDPOINTS: dict[str, Endpoint[Any]] = {"gateway": GATEWAY, "orders": ORDERS,
                                               "ledger": LEDGER}
#: Endpoints whose handlers create blobs or call HTTP services: never `state`.
ARTIFACT_ENDPOINTS = frozenset({"orders", "payments"})


class SettingsError(Exception):
    """A setting is invalid; the message names the environment variable."""


class Settings(BaseSettings):
    """Every setting of the service; the environment variable is `EO_<NAME>` (upper case).

    Strategies are per endpoint (`EO_STRATEGIES='{"ledger": "outbox"}'`); the gateway always
    uses `outbox` (protocol 4: outside producers create no tokens). `state` is refused for an
    endpoint that uses artifacts (blobs, HTTP) or sends to a token-based receiver
    (application/state_based.py): in the sample only the ledger may use it.
    """

    model_config = SettingsConfigDict(env_prefix="EO_", extra="ignore")

    profile: Profile = "embedded"
    failpoints: str = Field("", description="protocol 10 rules, e.g. after_commit=crash@3")
    strategies: dict[str, Strategy] = Field(default_factory=lambda: dict(DEFAULT_STRATEGIES))
    conflict_retries: int = Field(3, ge=0, description="immediate retries after a conflict")
    max_attempts: int = Field(5, ge=1, description="deliveries before dead-lettering")
    retry_delays_s: tuple[float, ...] = (0.05, 0.2, 1.0, 5.0)
    prefetch: int = Field(8, ge=1, description="deliveries in flight per consumer")
    cleanup_grace_s: float = Field(1800.0, gt=0, description="longer than any attempt lives")
    stale_after_s: float = Field(30.0, gt=0, description="finish committed TRs older than this")
    retention_days: float = Field(7.0, gt=0, description="inbox rows and HTTP tombstones")
    sweep_interval_s: float = Field(10.0, gt=0)
    credit_limit: Decimal = Field(Decimal("1000000"), ge=0, description="payments accounts")
    blob_dir: Path = Path("var/blobs")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    database_dsn: SecretStr | None = Field(None, description="the endpoint's PostgreSQL")
    token_dsn: SecretStr | None = Field(None, description="token store; default: database")
    amqp_url: SecretStr | None = Field(None, description="RabbitMQ")
    pool_size: int = Field(8, ge=1, description="PostgreSQL connections per pool")
    migrate_on_start: bool = False
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=0, le=65535, description="0 turns the server off")
    delivery_limit: int = Field(20, ge=1, description="x-delivery-limit of work queues")
    max_body_bytes: int = Field(1_048_576, ge=1, description="larger bodies are dead-lettered")
    blob_store: Literal["directory", "s3"] | None = Field(
        None, description="default: directory for embedded, s3 otherwise")
    s3_endpoint_url: str | None = Field(
        None, description="S3 API; unset: a moto server (local) or AWS (production)")
    s3_bucket: str = Field("eo-invoices", min_length=3, max_length=63)
    s3_region: str = "us-east-1"
    s3_access_key: SecretStr | None = None
    s3_secret_key: SecretStr | None = None
    payments_url: str | None = Field(
        None, description="payments callee base URL; unset: in-process callee")
    payments_token: SecretStr | None = Field(None, description="bearer token of payments")
    payments_host: str = "127.0.0.1"
    payments_port: int = Field(8470, ge=1, le=65535)
    payments_max_body_bytes: int = Field(65536, ge=1)
    http_timeout_s: float = Field(10.0, gt=0, description="caller's HTTP timeouts")
    inbox_poll_s: float = Field(1.0, gt=0,
                                description="gateway: how often the inbox relay looks for rows")
    inbox_batch: int = Field(200, ge=1, description="gateway: inbox rows relayed per round")
    duplicate_rate: float = Field(0.0, ge=0, le=1,
                                  description="fault injection: share of dispatches re-published")
    spark_master: str = Field("local[*]", min_length=1,
                              description="Spark master of `eo pipeline` (local[*], spark://...)")
    spark_driver_memory: str = Field("1g", pattern=r"^\d+[kmgt]?$",
                                     description="spark.driver.memory, e.g. 1g")
    spark_jdbc_jar: Path | None = Field(
        None, description="PostgreSQL JDBC driver jar; default: Debian's libpostgresql-jdbc-java")
    audit_older_than_s: float = Field(
        3600.0, ge=0, description="audit: orphans, tokens and unfinished TRs older than this")

    @field_validator("failpoints")
    @classmethod
    def _valid_failpoints(cls, value: str) -> str:
        parse(value)
        return value

    @field_validator("strategies")
    @classmethod
    def _over_defaults(cls, value: dict[str, Strategy]) -> dict[str, Strategy]:
        return {**DEFAULT_STRATEGIES, **value}  # naming one endpoint keeps the others

    @field_validator("retry_delays_s")
    @classmethod
    def _some_delay(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(d < 0 for d in value):
            raise ValueError("needs at least one non-negative delay")
        return value

    @model_validator(mode="after")
    def _gateway_is_outbox(self) -> Settings:
        if self.strategies.get("gateway", Strategy.OUTBOX) is not Strategy.OUTBOX:
            raise ValueError("strategies: the gateway must use 'outbox' (outside producers "
                             "create no tokens)")
        return self

    @model_validator(mode="after")
    def _state_wiring(self) -> Settings:
        errors = state_wiring_errors(SAMPLE_ENDPOINTS, self.strategies, ARTIFACT_ENDPOINTS)
        if errors:
            raise ValueError("strategies: " + "; ".join(errors))
        return self

    @model_validator(mode="after")
    def _production_needs_services(self) -> Settings:
        if self.profile == "production":
            for name in ("database_dsn", "amqp_url"):
                if getattr(self, name) is None:
                    raise ValueError(f"{name}: required by the production profile")
        return self

    @model_validator(mode="after")
    def _payments_url_needs_token(self) -> Settings:
        if self.payments_url and self.payments_token is None:
            raise ValueError("payments_token: required when EO_PAYMENTS_URL is set")
        return self

    def database(self) -> str:
        """The endpoint database DSN (the local profile defaults to the local server)."""
        if self.database_dsn is not None:
            return self.database_dsn.get_secret_value()
        return LOCAL_DATABASE

    def tokens_database(self) -> str:
        """The token store's DSN: `EO_TOKEN_DSN`, else the endpoint database."""
        return self.token_dsn.get_secret_value() if self.token_dsn else self.database()

    def amqp(self) -> str:
        """The RabbitMQ URL (the local profile defaults to guest on localhost)."""
        return self.amqp_url.get_secret_value() if self.amqp_url else LOCAL_AMQP

    def blobs_in_s3(self) -> bool:
        """Whether blobs go to an S3 API (else to `blob_dir`)."""
        if self.blob_store is not None:
            return self.blob_store == "s3"
        return self.profile != "embedded"

    def strategy(self, endpoint: str) -> Strategy:
        """The configured strategy of `endpoint` (token by default)."""
        return self.strategies.get(endpoint, Strategy.TOKEN)


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment plus `overrides`; raises `SettingsError` naming the
    `EO_...` variable of the first invalid setting."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["loc"]:
            field = str(first["loc"][0])
        else:  # a model validator: its message starts with "<field>: "
            field, _, message = message.partition(": ")
        raise SettingsError(f"invalid setting EO_{field.upper()}: {message}") from exc
    except PydanticSettingsError as exc:  # a JSON-valued variable that is not JSON
        match = re.search(r'field "(\w+)"', str(exc))
        name = f"EO_{match.group(1).upper()}" if match else "an EO_ variable"
        raise SettingsError(f"invalid setting {name}: not valid JSON") from exc
