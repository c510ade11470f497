"""The service's endpoints as one declaration (the registry): what each endpoint is, its role,
its default strategy and what it uses. Everything the framework knows about endpoints comes
from a `Registry`: the composition per profile, the topology, settings validation, the status
server and `eo inspect`. A service declares its own in `service/registry.py`."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from application.strategy import DEDUPLICATE_BY_ID, Strategy
from domain.decisions import Endpoint

#: Endpoint names are queue names (`<name>`, `<name>.retry.<ms>ms`, `<name>.dlq`), table keys
#: and environment-variable parts (`EO_CALLEES__<NAME>__URL`): lower case, digits, `-`, `_`.
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
#: A blob prefix `Context.artifact_key` takes: parts of word characters, dots and dashes
_PREFIX = re.compile(r"^[\w.-]+(?:/[\w.-]+)*$")


class RegistryError(ValueError):
    """The registry (or a strategy chosen in settings) cannot run; the message lists why."""


class Role(enum.StrEnum):
    """What an endpoint does in the service.

    - `CONSUMER`: consumes its work queue; its messages come from this service's endpoints
      (token by default, or outbox or state);
    - `GATEWAY`: the boundary: consumes messages of outside producers (their natural message
      IDs, no tokens), so always the outbox strategy; batch producers may also insert into its
      inbox table, which the gateway relays to its work queue;
    - `CALLEE`: an HTTP callee of protocol 6 (`eo serve --endpoint <name>`): its stored
      requests are its tokens; other endpoints call it by name.
    """

    CONSUMER = "consumer"
    GATEWAY = "gateway"
    CALLEE = "callee"


@dataclass(frozen=True)
class ThirdPartyApi:
    """A third-party HTTP API the service calls through its `Idempotency-Key` header
    (protocol 12; `CallApi`), by `name`, which is also its settings' key
    (`EO_APIS__<NAME>__URL`, `__TOKEN`, ...).

    - `key_retention`: how long the provider keeps an idempotency key and its answer (Stripe:
      24 hours): a follow-up is never sent later than that after its commit (it is
      dead-lettered, "idempotency window expired"); settings may shorten it, never lengthen;
    - `timeout_s`: one request's timeout (seconds);
    - `tries`: sends per attempt on a network error, a 5xx or a 409 (the key's first request
      still running), with the same key, before the attempt is retried later.
    """

    name: str
    key_retention: timedelta = timedelta(hours=24)
    timeout_s: float = 10.0
    tries: int = 3


@dataclass(frozen=True)
class Registration:
    """One endpoint of the service.

    - `endpoint`: the pure definition (messages, partitioning, handler, state type, outputs);
    - `role`: see `Role`;
    - `strategy`: the default deduplication strategy (settings may override it per
      endpoint); None means `token`, or `outbox` for a gateway;
    - `blobs`: its handler creates blobs (`Decision.blobs`), so it needs a blob store;
    - `callees`: the HTTP callees its handler calls (`CallHttp.service`), by endpoint name;
    - `request_type`: a callee's stored-request message type; None means its only message
      type;
    - `apis`: the third-party APIs its handler calls (`CallApi.api`), by name;
    - `blob_prefixes` (with `blobs`): the prefixes its handler gives
      `Context.artifact_key`: the only objects `eo pipeline audit` may call orphans and
      `eo pipeline sweep` may delete; empty: the prefixes of the keys its states name;
    - `blob_fields`: the top-level fields of its state that hold artifact keys (its own
      blobs' or another endpoint's), read directly by the audit; empty: every artifact key
      in the state's JSON.
    """

    endpoint: Endpoint[Any]
    role: Role = Role.CONSUMER
    strategy: Strategy | None = None
    blobs: bool = False
    callees: tuple[str, ...] = ()
    request_type: str | None = None
    apis: tuple[str, ...] = ()
    blob_prefixes: tuple[str, ...] = ()
    blob_fields: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The endpoint's name (its queue, its rows' key)."""
        return self.endpoint.name

    @property
    def default_strategy(self) -> Strategy:
        """`strategy`, or the role's default."""
        if self.strategy is not None:
            return self.strategy
        return Strategy.OUTBOX if self.role is Role.GATEWAY else Strategy.TOKEN

    @property
    def stored_request(self) -> str:
        """A callee's stored-request type name; RegistryError when it has none or several."""
        if self.request_type is not None:
            return self.request_type
        if len(self.endpoint.messages) != 1:
            raise RegistryError(f"{self.name}: a callee with several message types needs "
                                "request_type")
        return next(iter(self.endpoint.messages))

    @property
    def uses_artifacts(self) -> bool:
        """Blobs, HTTP calls or stored replies: artifacts the state strategy cannot keep
        (a third-party API's request travels in a follow-up's token, which it has not)."""
        return self.blobs or bool(self.callees) or bool(self.apis) or self.role is Role.CALLEE


@dataclass(frozen=True)
class Registry:
    """The service: its `name` (package metadata, connection names), its endpoints and the
    third-party APIs they call. Raises `RegistryError` at construction when the declaration
    cannot run (see `errors`)."""

    service: str
    endpoints: tuple[Registration, ...]
    apis: tuple[ThirdPartyApi, ...] = ()
    _by_name: dict[str, Registration] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {r.name: r for r in self.endpoints})
        problems = self.errors()
        if problems:
            raise RegistryError("the registry cannot run: " + "; ".join(problems))

    def __iter__(self) -> Iterator[Registration]:
        return iter(self.endpoints)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Registration:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no endpoint {name!r}; the service has {self.names()}") from None

    def names(self, *roles: Role) -> list[str]:
        """Endpoint names, in declaration order, of `roles` (all when none given)."""
        return [r.name for r in self.endpoints if not roles or r.role in roles]

    def api(self, name: str) -> ThirdPartyApi:
        """The third-party API declared as `name`; KeyError when none is."""
        for api in self.apis:
            if api.name == name:
                return api
        raise KeyError(f"no third-party API {name!r}; the service declares "
                       f"{[a.name for a in self.apis]}")

    def consuming(self) -> list[str]:
        """Endpoints with a work queue (consumers and gateways), in declaration order."""
        return self.names(Role.CONSUMER, Role.GATEWAY)

    def queues_of(self, name: str) -> list[str]:
        """The work queues endpoint `name` needs declared: its own (callees have none) and
        its outputs'."""
        registration = self[name]
        own = [] if registration.role is Role.CALLEE else [name]
        return list(dict.fromkeys([*own, *registration.endpoint.outputs]))

    def strategies(self, overrides: Mapping[str, Strategy | str] | None = None
                   ) -> dict[str, Strategy]:
        """Every endpoint's strategy: its default, or `overrides` (from settings). Raises
        `RegistryError` naming the problems (an unknown endpoint, a strategy its role or
        its wiring does not allow)."""
        overrides = dict(overrides or {})
        unknown = sorted(set(overrides) - set(self._by_name))
        chosen = {r.name: r.default_strategy for r in self.endpoints}
        problems = [f"{name}: no such endpoint (the service has {self.names()})"
                    for name in unknown]
        for name, value in overrides.items():
            if name in chosen:
                try:
                    chosen[name] = Strategy(value)
                except ValueError:
                    problems.append(f"{name}: unknown strategy {value!r} (token, outbox or "
                                    "state)")
        problems += self.errors(chosen) if not problems else []
        if problems:
            raise RegistryError("; ".join(problems))
        return chosen

    def errors(self, strategies: Mapping[str, Strategy] | None = None) -> list[str]:
        """Why this registry (with `strategies`, default: each endpoint's default) cannot
        run; empty when it can. Checked: names, unique; each message key is its class's name
        (the type a message travels under); outputs go to endpoints with a work
        queue; callees named exist and are callees; a gateway uses `outbox` and a callee
        `token`; `outbox` only for an endpoint that calls no callee (a follow-up's request
        URL is trusted from its token); `state` only for an endpoint without artifacts
        (blobs, HTTP) whose receivers drop copies by message ID (`outbox` or `state`: a state
        endpoint's outputs carry no token)."""
        problems: list[str] = []
        seen: set[str] = set()
        for r in self.endpoints:
            if not _NAME.match(r.name):
                problems.append(f"{r.name!r}: an endpoint name is lower case letters, digits, "
                                "'-' or '_', starting with a letter")
            if r.name in seen:
                problems.append(f"{r.name}: declared twice")
            seen.add(r.name)
            for key, cls in r.endpoint.messages.items():
                # senders type a message by its class's name, receivers decode it by key:
                # another key dead-letters every message of that class as of unknown type
                if key != cls.__name__:
                    problems.append(f"{r.name}: message key {key!r} is not the name of its "
                                    f"class {cls.__name__} (messages travel typed by their "
                                    f"class's name: use {cls.__name__!r})")
        names = [a.name for a in self.apis]
        for api in self.apis:
            if not _NAME.match(api.name) or names.count(api.name) > 1:
                problems.append(f"third-party API {api.name!r}: a name is lower case letters, "
                                "digits, '-' or '_', starting with a letter, declared once")
            if api.key_retention <= timedelta(0) or api.timeout_s <= 0 or api.tries < 1:
                problems.append(f"third-party API {api.name}: key_retention and timeout_s "
                                "are positive, tries at least 1")
        chosen = {r.name: r.default_strategy for r in self.endpoints}
        chosen.update(strategies or {})
        for r in self.endpoints:
            problems += self._wiring(r, chosen)
        return problems

    def _wiring(self, r: Registration, chosen: Mapping[str, Strategy]) -> list[str]:
        problems = []
        strategy = chosen[r.name]
        for out in r.endpoint.outputs:
            target = self._by_name.get(out)
            if target is None:
                problems.append(f"{r.name} sends to {out}, which is not registered")
            elif target.role is Role.CALLEE:
                problems.append(f"{r.name} sends to {out}, an HTTP callee (call it with "
                                "CallHttp instead)")
            elif strategy is Strategy.STATE and chosen[out] not in DEDUPLICATE_BY_ID:
                problems.append(f"{r.name}=state sends to {out}, which uses "
                                f"{str(chosen[out])!r}: a state endpoint's outputs carry no "
                                "token, so every receiver must use 'outbox' or 'state'")
        if r.blob_prefixes and not r.blobs:
            problems.append(f"{r.name}: blob_prefixes name the blobs of an endpoint with "
                            "blobs=True")
        for prefix in r.blob_prefixes:
            if not _PREFIX.match(prefix):
                problems.append(f"{r.name}: blob prefix {prefix!r} is not a key prefix (letters, "
                                "digits, '.', '_', '-', '/' between parts, no '/' at an end)")
        for callee in r.callees:
            target = self._by_name.get(callee)
            if target is None or target.role is not Role.CALLEE:
                problems.append(f"{r.name} calls {callee}, which is not a registered callee")
        if r.role is Role.GATEWAY and strategy is not Strategy.OUTBOX:
            problems.append(f"{r.name}: a gateway uses 'outbox' (outside producers create "
                            "no tokens)")
        if r.role is Role.CALLEE:
            if strategy is not Strategy.TOKEN:
                problems.append(f"{r.name}: a callee uses 'token' (its stored requests are "
                                "its tokens)")
            try:
                request = r.stored_request
                if request not in r.endpoint.messages:
                    problems.append(f"{r.name}: request_type {request!r} is not one of its "
                                    "message types")
            except RegistryError as exc:
                problems.append(str(exc))
        for api in r.apis:
            if api not in {a.name for a in self.apis}:
                problems.append(f"{r.name} calls the third-party API {api}, which the "
                                "registry does not declare (Registry.apis)")
        if r.apis and r.role is not Role.CONSUMER:
            problems.append(f"{r.name}: only a consumer calls third-party APIs (its follow-up "
                            "comes back to its own work queue)")
        if strategy is Strategy.OUTBOX and r.callees:
            problems.append(f"{r.name}=outbox: it calls HTTP callees, and the outbox path "
                            "reads no token, where a follow-up's request URL is kept")
        if strategy is Strategy.OUTBOX and r.apis:
            problems.append(f"{r.name}=outbox: it calls third-party APIs, and the outbox "
                            "path reads no token, where a follow-up's request is kept")
        if strategy is Strategy.STATE and r.uses_artifacts:
            problems.append(f"{r.name}=state: it creates blobs, calls HTTP callees or stores "
                            "replies, which the state strategy does not support")
        return problems
