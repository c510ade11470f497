"""Settings from the environment (prefix `EO_`), validated at start-up (the service they name:
entrypoints/service_spec.py)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as PydanticSettingsError

from application import defaults
from application.failpoints import needs_gates, parse
from application.settlement import default_prefetch
from application.strategy import Strategy
from entrypoints.credentials import production_credentials
from entrypoints.named_settings import ApiSettings, CalleeSettings

Profile = Literal["embedded", "local", "production"]
LOCAL_DATABASE = "postgresql://postgres@127.0.0.1:5432/eo"
LOCAL_AMQP = "amqp://guest:guest@127.0.0.1:5672/"
#: The blobs' bucket of the embedded and local profiles (production names its own).
LOCAL_BUCKET = "eo-invoices"
#: Where the service's registry is, unless `EO_SERVICE` says otherwise.
DEFAULT_SERVICE = "service.registry:REGISTRY"
#: The first status port tried when `EO_METRICS_PORT` is unset (then the next free one).
FIRST_STATUS_PORT = 9464


S = TypeVar("S", bound="Settings")


class SettingsError(Exception):
    """A setting is invalid; the message names the environment variable."""


class Settings(BaseSettings):
    """Every setting of the framework; the environment variable is `EO_<NAME>` (upper case),
    nested ones `EO_<NAME>__<KEY>__<FIELD>` (e.g. `EO_CALLEES__PAYMENTS__URL`).

    Strategies are per endpoint (`EO_STRATEGIES='{"ledger": "outbox"}'`) over the registry's
    defaults, checked against the registry at start-up (`resolve_service`).
    """

    # the input of a failed validation holds every setting, DSNs and passwords included:
    # never in an error (the chained ValidationError of a `SettingsError` traceback)
    model_config = SettingsConfigDict(env_prefix="EO_", env_nested_delimiter="__",
                                      extra="ignore", hide_input_in_errors=True)

    profile: Profile = "embedded"
    service: str = Field(DEFAULT_SERVICE, pattern=r"^[\w.]+:\w+$",
                         description="the service's registry, as module:attribute")
    failpoints: str = Field("", description="protocol 10 rules, e.g. after_commit=crash@3")
    failpoint_gates: Path | None = Field(
        None, description="the directory where wait:<gate> failpoints look for their gate "
        "files")
    strategies: dict[str, Strategy] = Field(
        default_factory=dict, description="per endpoint, over the registry's defaults")
    conflict_retries: int = Field(defaults.CONFLICT_RETRIES, ge=0,
                                  description="immediate retries after a conflict")
    max_attempts: int = Field(defaults.MAX_ATTEMPTS, ge=1,
                              description="deliveries before dead-lettering")
    retry_delays_s: tuple[float, ...] = defaults.RETRY_DELAYS_S
    prefetch: int | None = Field(
        None, ge=1, description="deliveries in flight per consumer; unset: three times "
        "EO_BATCH_SIZE for an endpoint that batches, 8 for one that does not "
        "(`prefetch_for`)")
    # EO_BATCH_SIZE unset beside a given EO_PREFETCH: a third of it, at most 50
    batch_size: int = Field(
        50, ge=1, description="deliveries processed as one unit (token path with co-located "
                             "tokens; docs/batching.md); 1 turns batching off")
    batch_wait_ms: float = Field(
        0.0, ge=0, le=10_000,
        description="how long a batch waits for more deliveries after its first")
    cleanup_grace_s: float = Field(defaults.CLEANUP_GRACE.total_seconds(), gt=0,
                                   description="longer than any attempt lives")
    stale_after_s: float = Field(defaults.STALE_AFTER.total_seconds(), gt=0,
                                 description="finish committed TRs older than this")
    retention_days: float = Field(defaults.RETENTION.days, gt=0,
                                  description="processed-message rows and HTTP tombstones")
    sweep_interval_s: float = Field(10.0, gt=0)
    blob_dir: Path = Path("var/blobs")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    database_dsn: SecretStr | None = Field(None, description="the endpoint's PostgreSQL")
    token_dsn: SecretStr | None = Field(None, description="token store; default: database")
    amqp_url: SecretStr | None = Field(None, description="RabbitMQ")
    pool_size: int = Field(defaults.POOL_SIZE, ge=1, description="PostgreSQL connections per "
                           "pool; each attempt in flight holds one")
    migrate_on_start: bool = False
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(
        None, ge=0, le=65535,
        description="status port; unset: the first free one from 9464; 0 turns it off")
    delivery_limit: int = Field(20, ge=1, description="x-delivery-limit of work queues")
    broker_give_up_s: float = Field(
        120.0, gt=0, description="exit with status 69 when the broker cannot be reached, or "
        "the work queue not consumed, for this long (the orchestrator restarts the process)")
    consumer_watchdog_s: float = Field(
        30.0, gt=0, description="re-create the consumer when its queue has ready messages, "
        "the consumer free slots, and no delivery came for this long")
    max_body_bytes: int = Field(defaults.MAX_BODY_BYTES, ge=1,
                                description="larger bodies are dead-lettered")
    max_state_bytes: int = Field(
        1_048_576, ge=0, description="the most a partition's state may take as JSON: a "
        "message whose handler would make it larger is dead-lettered; 0: unbounded")
    dead_letter_body_bytes: int = Field(
        defaults.DEAD_LETTER_BODY_BYTES, ge=0,
        description="the most of a malformed or oversize body a dead letter keeps "
        "(with the body's size and SHA-256)")
    dead_letter_max_bytes: int = Field(
        268_435_456, ge=0, description="byte bound of a new dead-letter queue (reject-publish: "
        "a refused dead letter waits in a retry queue); 0: unbounded")
    kept_headers: tuple[str, ...] = Field(
        (), description="producers' headers a delivery keeps (and its retry and dead-letter "
        "copies), e.g. [\"traceparent\"]; every other non-protocol header is dropped")
    blob_store: Literal["directory", "s3"] | None = Field(
        None, description="default: directory for embedded, s3 otherwise")
    s3_endpoint_url: str | None = Field(
        None, description="S3 API; unset: a moto server (local) or AWS (production)")
    s3_bucket: str | None = Field(
        None, min_length=3, max_length=63,
        description="the blobs' bucket; local: eo-invoices; production: required")
    s3_expected_bucket_owner: str | None = Field(
        None, pattern=r"^\d{12}$", description="the AWS account that must own the bucket "
        "(S3's ExpectedBucketOwner on every request)")
    s3_region: str = "us-east-1"
    s3_access_key: SecretStr | None = None
    s3_secret_key: SecretStr | None = None
    callees: dict[str, CalleeSettings] = Field(
        default_factory=dict, description="HTTP callees by endpoint name")
    apis: dict[str, ApiSettings] = Field(
        default_factory=dict, description="third-party APIs by registry name (protocol 12)")
    http_timeout_s: float = Field(10.0, gt=0, description="caller's HTTP timeouts")
    inbox_poll_s: float = Field(1.0, gt=0,
                                description="gateways: how often the inbox relay looks for rows")
    inbox_batch: int = Field(200, ge=1, description="gateways: inbox rows relayed per round")
    duplicate_rate: float = Field(0.0, ge=0, le=1,
                                  description="fault injection: share of dispatches re-published")
    dead_letter_collect: bool = Field(
        True, description="consumers move their endpoint's dead-letter queue into the "
        "dead-letter store every EO_SWEEP_INTERVAL_S, where `eo dead-letters` acts on them; "
        "false: dead letters stay in the queue")
    dead_letter_retention_days: float = Field(
        14.0, gt=0, description="dead letters nobody replayed or discarded are discarded "
        "(their tokens deleted, logged with by=retention) this long after they were last "
        "dead-lettered; replayed and discarded ones are forgotten as late")
    operator_tokens: dict[str, SecretStr] = Field(
        default_factory=dict, description="the operators of the dead-letter API and the "
        "operator page: name -> bearer token (`eo dead-letters serve`, `eo operator`; the name "
        "is logged with each action)")
    operator_host: str = Field("127.0.0.1", description="where `eo dead-letters serve` and "
                               "`eo operator` listen")
    operator_metrics_urls: tuple[str, ...] = Field(
        (), description="the consumers' status URLs whose /metrics `eo operator` sums for its "
        "event rates, e.g. [\"http://orders-0:9464\"]")
    operator_port: int = Field(0, ge=0, le=65535, description="its port (0: a free one, "
                               "printed at start-up)")
    allow_anonymous_producers: bool = Field(
        False, description="production: accept gateway messages without an AMQP user_id "
        "(unauthenticated producers share one deduplication scope)")
    allow_guest_broker_credentials: bool = Field(
        False, description="production: accept an EO_AMQP_URL that logs in with RabbitMQ's "
        "guest account or password (also what a URL without a user or password sends)")
    allow_passwordless_dsn: bool = Field(
        False, description="production: accept a PostgreSQL DSN with neither a password nor "
        "a client certificate (trust or peer authentication, ~/.pgpass)")
    allow_plain_http_callees: bool = Field(
        False, description="production: accept http:// callee URLs (the bearer token then "
        "travels in clear)")

    @field_validator("failpoints")
    @classmethod
    def _valid_failpoints(cls, value: str) -> str:
        parse(value)
        return value

    @model_validator(mode="after")
    def _gates_for_waits(self) -> Settings:
        if self.failpoint_gates is None and needs_gates(parse(self.failpoints)):
            raise ValueError("failpoint_gates: a wait:<gate> failpoint needs the directory of "
                             "its gate files")
        return self

    @field_validator("retry_delays_s")
    @classmethod
    def _some_delay(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(d < 0 for d in value):
            raise ValueError("needs at least one non-negative delay")
        return value

    @model_validator(mode="after")
    def _batch_fits_in_flight(self) -> Settings:
        if self.prefetch is None:  # chosen per endpoint (`prefetch_for`)
            return self
        if "batch_size" not in self.model_fields_set:  # a prefetch of its own: 3 batches fit
            self.batch_size = max(1, min(self.batch_size,
                                         self.prefetch // defaults.PREFETCH_IN_BATCHES))
        if self.batch_size > self.prefetch:
            raise ValueError(f"batch_size: {self.batch_size} exceeds prefetch "
                             f"{self.prefetch}, the deliveries in flight a batch is made of")
        return self

    @model_validator(mode="after")
    def _production_needs_services(self) -> Settings:
        if self.profile == "production":
            for name in ("database_dsn", "amqp_url"):
                if getattr(self, name) is None:
                    raise ValueError(f"{name}: required by the production profile")
            if self.failpoints.strip():
                raise ValueError("failpoints: fault injection is refused by the production "
                                 "profile")
            if self.duplicate_rate:
                raise ValueError("duplicate_rate: fault injection is refused by the "
                                 "production profile")
            production_credentials(self)
        return self

    def prefetch_for(self, batches: bool) -> int:
        """The deliveries in flight of one consumer (RabbitMQ's `prefetch_count`):
        `EO_PREFETCH` when set, else `application.settlement.default_prefetch` for a
        consumer that batches (`Settler.batches`) or not."""
        if self.prefetch is not None:
            return self.prefetch
        return default_prefetch(batches, self.batch_size)

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

    def bucket(self) -> str:
        """The blobs' bucket: `EO_S3_BUCKET`, else (embedded and local profiles only) the
        local default. Raises `SettingsError` in production without one."""
        if self.s3_bucket is not None:
            return self.s3_bucket
        if self.profile == "production":
            raise SettingsError("invalid setting EO_S3_BUCKET: required by the production "
                                "profile (there is no default bucket)")
        return LOCAL_BUCKET

    def blobs_in_s3(self) -> bool:
        """Whether blobs go to an S3 API (else to `blob_dir`)."""
        if self.blob_store is not None:
            return self.blob_store == "s3"
        return self.profile != "embedded"

    def callee(self, name: str) -> CalleeSettings:
        """The settings of callee `name` (its defaults when none are set)."""
        return self.callees.get(name) or CalleeSettings.model_validate({})

    def api(self, name: str) -> ApiSettings:
        """The settings of third-party API `name` (its defaults when none are set)."""
        return self.apis.get(name) or ApiSettings.model_validate({})


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment plus `overrides`; raises `SettingsError` naming the
    `EO_...` variable of the first invalid setting."""
    return load_settings_as(Settings, **overrides)


def load_settings_as(cls: type[S], **overrides: Any) -> S:
    """`load_settings` for a subclass of `Settings` (a tool's, with settings of its own)."""
    try:
        return cls(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        loc = [str(part) for part in first["loc"]]
        if not loc:  # a model validator: its message starts with "<field>: "
            field, _, message = message.partition(": ")
            loc = [field]
        elif loc[0] == "callees" and len(loc) == 2:  # a callee's own validator
            field, _, message = message.partition(": ")
            loc.append(field)
        raise SettingsError(f"invalid setting EO_{'__'.join(loc).upper()}: {message}") from exc
    except PydanticSettingsError as exc:  # a JSON-valued variable that is not JSON
        match = re.search(r'field "(\w+)"', str(exc))
        name = f"EO_{match.group(1).upper()}" if match else "an EO_ variable"
        raise SettingsError(f"invalid setting {name}: not valid JSON") from exc


