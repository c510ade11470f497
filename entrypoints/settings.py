"""Settings from the environment (prefix `EO_`), validated at start-up (the service they name:
entrypoints/service_spec.py)."""

from __future__ import annotations

import functools
import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings import SettingsError as PydanticSettingsError

from adapters.rabbitmq.urls import broker_urls
from application.settlement import default_prefetch
from application.strategy import Strategy
from entrypoints.credentials import production_credentials
from entrypoints.named_settings import ApiSettings, CalleeSettings
from entrypoints.setting_groups import (
    BlobSettings,
    DeadLetterSettings,
    FaultSettings,
    HttpSettings,
    OperatorSettings,
    PostgresSettings,
    ProductionSettings,
    ProtocolSettings,
    RabbitSettings,
)

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
    """Every setting of the framework, by job: the service's (`profile`, `service`,
    `strategies`, `log_level`) and one nested model per job (entrypoints/setting_groups.py:
    `protocol`, `postgres`, `rabbitmq`, `blobs`, `http`, `dead_letters`, `operator`, `faults`,
    `production`). The environment variable of a setting is `EO_<FIELD>` (upper case)
    whatever its group (`settings.rabbitmq.amqp_url` is `EO_AMQP_URL`); settings kept by name
    are `EO_<FIELD>__<NAME>__<KEY>` (e.g. `EO_CALLEES__PAYMENTS__URL`). Keyword overrides
    (`load_settings(amqp_url=...)`) and `replaced` take the same flat names.

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
    strategies: dict[str, Strategy] = Field(
        default_factory=dict, description="per endpoint, over the registry's defaults")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    protocol: ProtocolSettings = Field(default_factory=ProtocolSettings.model_construct)
    postgres: PostgresSettings = Field(default_factory=PostgresSettings.model_construct)
    rabbitmq: RabbitSettings = Field(default_factory=RabbitSettings.model_construct)
    blobs: BlobSettings = Field(default_factory=BlobSettings.model_construct)
    http: HttpSettings = Field(default_factory=HttpSettings.model_construct)
    dead_letters: DeadLetterSettings = Field(default_factory=DeadLetterSettings.model_construct)
    operator: OperatorSettings = Field(default_factory=OperatorSettings.model_construct)
    faults: FaultSettings = Field(default_factory=FaultSettings.model_construct)
    production: ProductionSettings = Field(default_factory=ProductionSettings.model_construct)

    @classmethod
    def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The environment read by flat names (`_flat_mirror`), nested by `_nested`."""
        return (init_settings, EnvSettingsSource(_flat_mirror(settings_cls)), dotenv_settings,
                file_secret_settings)

    @model_validator(mode="before")
    @classmethod
    def _nested(cls, data: Any) -> Any:
        """Flat names (from the environment or keyword overrides) into their groups; a
        group given as a whole (a dict or a model) wins over its flat names."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for group, model in groups_of(cls).items():
            flat = {leaf: data.pop(leaf) for leaf in model.model_fields if leaf in data}
            if flat:
                given = data.get(group) or {}
                if isinstance(given, BaseModel):
                    given = given.model_dump(exclude_unset=True)
                data[group] = {**flat, **given}
        return data

    @model_validator(mode="after")
    def _production_needs_services(self) -> Settings:
        if self.profile == "production":
            for name, value in (("database_dsn", self.postgres.database_dsn),
                                ("amqp_url", self.rabbitmq.amqp_url)):
                if value is None:
                    raise ValueError(f"{name}: required by the production profile")
            if self.faults.failpoints.strip():
                raise ValueError("failpoints: fault injection is refused by the production "
                                 "profile")
            if self.faults.duplicate_rate:
                raise ValueError("duplicate_rate: fault injection is refused by the "
                                 "production profile")
            production_credentials(self)
        return self

    def prefetch_for(self, batches: bool) -> int:
        """The deliveries in flight of one consumer (RabbitMQ's `prefetch_count`):
        `EO_PREFETCH` when set, else `application.settlement.default_prefetch` for a
        consumer that batches (`Settler.batches`) or not."""
        if self.protocol.prefetch is not None:
            return self.protocol.prefetch
        return default_prefetch(batches, self.protocol.batch_size)

    def database(self) -> str:
        """The endpoint database DSN (the local profile defaults to the local server)."""
        if self.postgres.database_dsn is not None:
            return self.postgres.database_dsn.get_secret_value()
        return LOCAL_DATABASE

    def tokens_database(self) -> str:
        """The token store's DSN: `EO_TOKEN_DSN`, else the endpoint database."""
        token_dsn = self.postgres.token_dsn
        return token_dsn.get_secret_value() if token_dsn else self.database()

    def amqp(self) -> str:
        """The RabbitMQ URL (the local profile defaults to guest on localhost)."""
        url = self.rabbitmq.amqp_url
        return url.get_secret_value() if url else LOCAL_AMQP

    def amqp_urls(self) -> list[str]:
        """The URLs a service connection tries in turn: `amqp()`, then the same with each
        of `EO_AMQP_ADDRESSES`' host and port (the cluster's other nodes)."""
        return broker_urls(self.amqp(), self.rabbitmq.amqp_addresses)

    def bucket(self) -> str:
        """The blobs' bucket: `EO_S3_BUCKET`, else (embedded and local profiles only) the
        local default. Raises `SettingsError` in production without one."""
        if self.blobs.s3_bucket is not None:
            return self.blobs.s3_bucket
        if self.profile == "production":
            raise SettingsError("invalid setting EO_S3_BUCKET: required by the production "
                                "profile (there is no default bucket)")
        return LOCAL_BUCKET

    def blobs_in_s3(self) -> bool:
        """Whether blobs go to an S3 API (else to `blob_dir`)."""
        if self.blobs.blob_store is not None:
            return self.blobs.blob_store == "s3"
        return self.profile != "embedded"

    def callee(self, name: str) -> CalleeSettings:
        """The settings of callee `name` (its defaults when none are set)."""
        return self.http.callees.get(name) or CalleeSettings.model_validate({})

    def api(self, name: str) -> ApiSettings:
        """The settings of third-party API `name` (its defaults when none are set)."""
        return self.http.apis.get(name) or ApiSettings.model_validate({})

    def replaced(self: S, **changes: Any) -> S:
        """A copy with `changes` by flat name (`replaced(amqp_url=SecretStr(url))`), each
        put in its group; not validated, as `model_copy`. Raises `TypeError` naming an
        unknown setting."""
        groups = groups_of(type(self))
        by_group: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for name, value in changes.items():
            group = next((g for g, model in groups.items() if name in model.model_fields), None)
            if group is not None:
                by_group.setdefault(group, {})[name] = value
            elif name in type(self).model_fields and name not in groups:
                top[name] = value
            else:
                raise TypeError(f"no setting named {name!r}")
        for group, update in by_group.items():
            top[group] = getattr(self, group).model_copy(update=update)
        return self.model_copy(update=top)

    def variables(self) -> dict[str, Any]:
        """Every setting by its environment variable (`EO_<FIELD>`), as JSON values
        (secrets hidden)."""
        groups = groups_of(type(self))
        flat: dict[str, Any] = {}
        for name, value in self.model_dump(mode="json").items():
            if name in groups:
                flat.update(value)
            else:
                flat[name] = value
        return {f"EO_{name.upper()}": value for name, value in flat.items()}


def groups_of(cls: type[BaseSettings]) -> dict[str, type[BaseModel]]:
    """The nested models of settings class `cls`, by field name."""
    return {name: info.annotation for name, info in cls.model_fields.items()
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}


def setting_names(cls: type[BaseSettings]) -> list[str]:
    """Every setting's flat name (`EO_<NAME>` upper-cased), the groups' fields included."""
    groups = groups_of(cls)
    names: list[str] = []
    for name in cls.model_fields:
        names.extend(groups[name].model_fields if name in groups else [name])
    return names


@functools.cache
def _flat_mirror(cls: type[BaseSettings]) -> type[BaseSettings]:
    """A settings class with every setting of `cls` at the top (the groups' fields in place
    of the groups), read by pydantic-settings' own environment source: its JSON values and
    `__` nesting for the settings kept by name. Never instantiated."""
    groups = groups_of(cls)
    fields = {leaf: info for name, top in cls.model_fields.items()
              for leaf, info in (groups[name].model_fields.items() if name in groups
                                 else [(name, top)])}
    namespace: dict[str, Any] = {
        "__annotations__": {name: info.annotation for name, info in fields.items()},
        "model_config": SettingsConfigDict(**cls.model_config),
        **fields}
    return type(f"Flat{cls.__name__}", (BaseSettings,), namespace)


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
        if loc and loc[0] in groups_of(cls):  # a group's field: its variable is flat
            loc = loc[1:]
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


