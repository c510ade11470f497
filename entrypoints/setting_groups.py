"""The framework's settings by job, each a model nested in `Settings` (entrypoints/settings.py)
whose fields keep their flat environment variables: field `amqp_url` of `Settings.rabbitmq`
is `EO_AMQP_URL`, as before the groups. A field name is unique across the groups."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from application import defaults
from application.failpoints import needs_gates, parse
from entrypoints.named_settings import ApiSettings, CalleeSettings


class ProtocolSettings(BaseModel):
    """The protocol's tunables (`Tunables` is made from them, entrypoints/composition.py) and
    what a delivery may carry. `Settings.protocol`."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

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
    max_body_bytes: int = Field(defaults.MAX_BODY_BYTES, ge=1,
                                description="larger bodies are dead-lettered")
    max_state_bytes: int = Field(
        1_048_576, ge=0, description="the most a partition's state may take as JSON: a "
        "message whose handler would make it larger is dead-lettered; 0: unbounded")
    dead_letter_body_bytes: int = Field(
        defaults.DEAD_LETTER_BODY_BYTES, ge=0,
        description="the most of a malformed or oversize body a dead letter keeps "
        "(with the body's size and SHA-256)")
    kept_headers: tuple[str, ...] = Field(
        (), description="producers' headers a delivery keeps (and its retry and dead-letter "
        "copies), e.g. [\"traceparent\"]; every other non-protocol header is dropped")
    inbox_poll_s: float = Field(1.0, gt=0,
                                description="gateways: how often the inbox relay looks for rows")
    inbox_batch: int = Field(200, ge=1, description="gateways: inbox rows relayed per round")

    @field_validator("retry_delays_s")
    @classmethod
    def _some_delay(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value or any(d < 0 for d in value):
            raise ValueError("needs at least one non-negative delay")
        return value

    @model_validator(mode="after")
    def _batch_fits_in_flight(self) -> ProtocolSettings:
        if self.prefetch is None:  # chosen per endpoint (`Settings.prefetch_for`)
            return self
        if "batch_size" not in self.model_fields_set:  # a prefetch of its own: 3 batches fit
            self.batch_size = max(1, min(self.batch_size,
                                         self.prefetch // defaults.PREFETCH_IN_BATCHES))
        if self.batch_size > self.prefetch:
            raise ValueError(f"batch_size: {self.batch_size} exceeds prefetch "
                             f"{self.prefetch}, the deliveries in flight a batch is made of")
        return self


class PostgresSettings(BaseModel):
    """The endpoint's PostgreSQL and the token store's. `Settings.postgres`."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    database_dsn: SecretStr | None = Field(None, description="the endpoint's PostgreSQL")
    token_dsn: SecretStr | None = Field(None, description="token store; default: database")
    pool_size: int = Field(defaults.POOL_SIZE, ge=1, description="PostgreSQL connections per "
                           "pool; each attempt in flight holds one")
    migrate_on_start: bool = False
    replication_check: Literal["warn", "require", "off"] = Field(
        "warn", description="start-up asks each database whether its commits are replicated "
        "synchronously (a failover loses none): production warns, `require` refuses to start "
        "in any profile, `off` does not ask")


class RabbitSettings(BaseModel):
    """RabbitMQ: the connection, the work queues' and dead-letter queues' bounds, how long
    a consumer waits for the broker. `Settings.rabbitmq`."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    amqp_url: SecretStr | None = Field(None, description="RabbitMQ")
    amqp_addresses: tuple[str, ...] = Field(
        (), description="the cluster's other nodes, host:port, e.g. [\"rabbit-1:5672\"]: "
        "a connection tries the URL's node, then these in turn (the URL's user, vhost, TLS)")
    delivery_limit: int = Field(20, ge=1, description="x-delivery-limit of work queues")
    broker_give_up_s: float = Field(
        120.0, gt=0, description="exit with status 69 when the broker cannot be reached, or "
        "the work queue not consumed, for this long (the orchestrator restarts the process)")
    consumer_watchdog_s: float = Field(
        30.0, gt=0, description="re-create the consumer when its queue has ready messages, "
        "the consumer free slots, and no delivery came for this long")
    dead_letter_max_bytes: int = Field(
        268_435_456, ge=0, description="byte bound of a new dead-letter queue (reject-publish: "
        "a refused dead letter waits in a retry queue); 0: unbounded")


    @field_validator("amqp_addresses")
    @classmethod
    def _host_and_port(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for address in value:
            host, sep, port = address.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{address!r} is not host:port")
        return value


class BlobSettings(BaseModel):
    """Where blobs go: a directory, or an S3 API's bucket. `Settings.blobs`."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    blob_store: Literal["directory", "s3"] | None = Field(
        None, description="default: directory for embedded, s3 otherwise")
    blob_dir: Path = Path("var/blobs")
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


class HttpSettings(BaseModel):
    """HTTP: the callees and third-party APIs by name, the callers' timeout. `Settings.http`."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    callees: dict[str, CalleeSettings] = Field(
        default_factory=dict, description="HTTP callees by endpoint name")
    apis: dict[str, ApiSettings] = Field(
        default_factory=dict, description="third-party APIs by registry name (protocol 12)")
    http_timeout_s: float = Field(10.0, gt=0, description="caller's HTTP timeouts")


class DeadLetterSettings(BaseModel):
    """The dead-letter store: collected from the queues, kept for how long.
    `Settings.dead_letters`."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    dead_letter_collect: bool = Field(
        True, description="consumers move their endpoint's dead-letter queue into the "
        "dead-letter store every EO_SWEEP_INTERVAL_S, where `eo dead-letters` acts on them; "
        "false: dead letters stay in the queue")
    dead_letter_retention_days: float = Field(
        14.0, gt=0, description="dead letters nobody replayed or discarded are discarded "
        "(their tokens deleted, logged with by=retention) this long after they were last "
        "dead-lettered; replayed and discarded ones are forgotten as late")


class OperatorSettings(BaseModel):
    """The consumers' status port and the operators' servers (`eo dead-letters serve`, `eo
    operator`). `Settings.operator`."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(
        None, ge=0, le=65535,
        description="status port; unset: the first free one from 9464; 0 turns it off")
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


class FaultSettings(BaseModel):
    """Fault injection (refused by the production profile). `Settings.faults`."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    failpoints: str = Field("", description="protocol 10 rules, e.g. after_commit=crash@3")
    failpoint_gates: Path | None = Field(
        None, description="the directory where wait:<gate> failpoints look for their gate "
        "files")
    duplicate_rate: float = Field(0.0, ge=0, le=1,
                                  description="fault injection: share of dispatches re-published")

    @field_validator("failpoints")
    @classmethod
    def _valid_failpoints(cls, value: str) -> str:
        parse(value)
        return value

    @model_validator(mode="after")
    def _gates_for_waits(self) -> FaultSettings:
        if self.failpoint_gates is None and needs_gates(parse(self.failpoints)):
            raise ValueError("failpoint_gates: a wait:<gate> failpoint needs the directory of "
                             "its gate files")
        return self


class ProductionSettings(BaseModel):
    """The production profile's exceptions to its checks of credentials and transport.
    `Settings.production`."""

    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

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
