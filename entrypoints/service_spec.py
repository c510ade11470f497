"""The service the settings name: its registry (`EO_SERVICE`) and each endpoint's strategy
(`EO_STRATEGIES`), checked against the settings of its callees and third-party APIs."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from application.registry import Registry, RegistryError, Role
from application.strategy import Strategy
from entrypoints.settings import Settings, SettingsError


@dataclass(frozen=True)
class Service:
    """The service the settings name: its registry and each endpoint's strategy."""

    registry: Registry
    strategies: dict[str, Strategy]

    def strategy(self, name: str) -> Strategy:
        """The strategy of endpoint `name` (KeyError when it is not registered)."""
        return self.strategies[name]


def load_registry(spec: str) -> Registry:
    """The `Registry` at `module:attribute`; raises `SettingsError` naming `EO_SERVICE` when
    it cannot be imported, is missing, is not a registry, or cannot run."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SettingsError(f"invalid setting EO_SERVICE: cannot import {module_name!r}: "
                            f"{exc}") from exc
    except RegistryError as exc:
        raise SettingsError(f"invalid setting EO_SERVICE: {exc}") from exc
    registry: Any = getattr(module, attribute, None)
    if not isinstance(registry, Registry):
        raise SettingsError(f"invalid setting EO_SERVICE: {spec} is not a Registry")
    return registry


def resolve_service(settings: Settings, registry: Registry | None = None) -> Service:
    """The service of `settings` (`registry` given, else the one `EO_SERVICE` names) with
    the strategies of `EO_STRATEGIES`; raises `SettingsError` naming the variable when the
    registry cannot be loaded, a strategy does not fit, a callee setting names no
    registered callee, or blobs go to S3 in production without `EO_S3_BUCKET`."""
    registry = registry or load_registry(settings.service)
    try:
        strategies = registry.strategies(settings.strategies)
    except RegistryError as exc:
        raise SettingsError(f"invalid setting EO_STRATEGIES: {exc}") from exc
    if any(r.blobs for r in registry) and settings.blobs_in_s3():
        settings.bucket()  # production names its bucket: refused at start-up otherwise
    callees = set(registry.names(Role.CALLEE))
    for name in settings.http.callees:
        if name not in callees:
            raise SettingsError(f"invalid setting EO_CALLEES__{name.upper()}: {name!r} is not "
                                f"a registered callee (callees: {sorted(callees)})")
    _check_apis(settings, registry)
    return Service(registry, strategies)


def _check_apis(settings: Settings, registry: Registry) -> None:
    """Third-party API settings name declared APIs, never lengthen a key's retention, and
    in production give every API an endpoint calls an https:// URL."""
    declared = {api.name: api for api in registry.apis}
    for name, own in settings.http.apis.items():
        variable = f"EO_APIS__{name.upper()}"
        if name not in declared:
            raise SettingsError(f"invalid setting {variable}: {name!r} is not a declared "
                                f"third-party API (Registry.apis: {sorted(declared)})")
        retention = declared[name].key_retention.total_seconds()
        if own.key_retention_s is not None and own.key_retention_s > retention:
            raise SettingsError(f"invalid setting {variable}__KEY_RETENTION_S: "
                                f"{own.key_retention_s:g} s is longer than the provider's "
                                f"{retention:g} s the registry declares: a request sent "
                                "after the provider forgot its key could execute twice")
        scheme = urlsplit(own.url).scheme.lower() if own.url else "https"
        if scheme not in ("http", "https"):
            raise SettingsError(f"invalid setting {variable}__URL: an http:// or https:// URL")
    if settings.profile != "production":
        return
    for name in sorted({api for r in registry for api in r.apis}):
        url = settings.api(name).url
        if url is None or urlsplit(url).scheme.lower() != "https":
            raise SettingsError(f"invalid setting EO_APIS__{name.upper()}__URL: the production "
                                "profile calls a third-party API at its https:// URL (the "
                                "in-process sandbox is for the embedded and local profiles)")
