"""Protocol 11's wiring: the registry's declarations and checks, the settings that name an
API's URL, credential and window, the sandbox announced by the processes that call an API
only, and the httpx adapter's request (key, credential, base URL fixed by settings,
`Retry-After`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from structlog.testing import capture_logs

from adapters.http.apis import ApiEndpoint, HttpxApis, retry_after_s
from application.errors import PermanentError, TransientError
from application.registry import Registration, Registry, RegistryError, ThirdPartyApi
from application.strategy import Strategy
from application.workers import api_policies
from entrypoints.composition import tunables_of
from entrypoints.local import LocalContainer
from entrypoints.resources import provided, shutdown_resources
from entrypoints.settings import SettingsError, load_settings, resolve_service
from tests.support.shipping import SHIPPING
from tests.support.shipping_service import REGISTRY


def test_the_registry_refuses_an_undeclared_api_and_the_outbox_and_state_strategies() -> None:
    with pytest.raises(RegistryError, match="which the registry does not declare"):
        Registry("s", (Registration(SHIPPING, apis=("carrier",)),))
    with pytest.raises(RegistryError, match="outbox path reads no token"):
        Registry("s", (Registration(SHIPPING, apis=("carrier",), strategy=Strategy.OUTBOX),),
                 apis=(ThirdPartyApi("carrier"),))
    with pytest.raises(RegistryError, match="state strategy does not support"):
        Registry("s", (Registration(SHIPPING, apis=("carrier",), strategy=Strategy.STATE),),
                 apis=(ThirdPartyApi("carrier"),))
    with pytest.raises(RegistryError, match="positive"):
        Registry("s", (), apis=(ThirdPartyApi("carrier", key_retention=timedelta(0)),))


def test_settings_may_shorten_a_keys_window_never_lengthen_it() -> None:
    settings = load_settings(apis={"carrier": {"key_retention_s": 600}})
    resolve_service(settings, REGISTRY)
    policies = api_policies(REGISTRY, tunables_of(settings))
    assert policies["carrier"].key_retention == timedelta(minutes=10)
    policies = api_policies(REGISTRY, tunables_of(load_settings()))
    assert policies["carrier"].key_retention == timedelta(hours=24)
    longer = load_settings(apis={"carrier": {"key_retention_s": 25 * 3600}})
    with pytest.raises(SettingsError, match="EO_APIS__CARRIER__KEY_RETENTION_S: 90000 s is "
                                            "longer than the provider's"):
        resolve_service(longer, REGISTRY)


def test_an_unknown_api_or_a_production_api_without_https_stops_start_up_naming_it() -> None:
    with pytest.raises(SettingsError, match="EO_APIS__MAILER: 'mailer' is not a declared"):
        resolve_service(load_settings(apis={"mailer": {"url": "https://m"}}), REGISTRY)
    production = {"profile": "production", "database_dsn": "postgresql://u:p@db/x",
                  "amqp_url": "amqp://u:p@mq/"}
    for apis in ({}, {"carrier": {"url": "http://carrier.example"}}):
        with pytest.raises(SettingsError, match="EO_APIS__CARRIER__URL: the production"):
            resolve_service(load_settings(**production, apis=apis), REGISTRY)
    resolve_service(load_settings(**production, apis={"carrier": {
        "url": "https://carrier.example", "token": "secret"}}), REGISTRY)


@pytest.mark.parametrize(("consumer", "announced"), [
    (None, []),                                      # eo inspect, eo dead-letters, eo operator
    ("shipping", [{"api": "carrier", "endpoint": "shipping"}]),  # eo consume of its caller
])
async def test_only_the_consumer_that_calls_an_api_warns_of_its_sandbox(
        consumer: str | None, announced: list[dict[str, str]]) -> None:
    settings = load_settings(profile="local")          # no EO_APIS__CARRIER__URL: a sandbox
    container = LocalContainer(settings=settings, service=resolve_service(settings, REGISTRY))
    if consumer is not None:
        container.consumer.override(consumer)         # as `started_container` does for it
    try:
        with capture_logs() as logs:
            apis = await provided(container.apis)
    finally:
        await shutdown_resources(container)
    assert set(getattr(apis, "routes", {})) == {"carrier"}   # the sandbox is there either way
    assert [{k: e.get(k) for k in ("api", "endpoint")} for e in logs
            if e["event"] == "api.sandbox"] == announced


async def test_a_request_carries_its_key_and_credential_to_the_configured_base_only() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(429, json={"error": "slow down"}, headers={"Retry-After": "7"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        apis = HttpxApis(client, {"carrier": ApiEndpoint("https://carrier.example/api/",
                                                         "s3cret", 2.0)})
        result = await apis.send("carrier", "POST", "/v1/shipments", b'{"a":1}', "k-1")
        with pytest.raises(PermanentError, match="not configured"):
            await apis.send("mailer", "POST", "/x", None, "k-2")
    [request] = seen
    assert str(request.url) == "https://carrier.example/api/v1/shipments"
    assert request.headers["Idempotency-Key"] == "k-1"
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert request.content == b'{"a":1}'
    assert (result.status, result.retry_after_s) == (429, 7.0)
    assert "s3cret" not in repr(apis) + repr(ApiEndpoint("u", "s3cret", 1.0))


async def test_a_network_error_is_transient() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with httpx.AsyncClient(transport=httpx.MockTransport(refuse)) as client:
        apis = HttpxApis(client, {"carrier": ApiEndpoint("https://c", None, 1.0)})
        with pytest.raises(TransientError, match="ConnectError"):
            await apis.send("carrier", "GET", "/x", None, "k")


def test_retry_after_reads_seconds_and_http_dates() -> None:
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert retry_after_s("30") == 30.0
    assert retry_after_s("Thu, 26 Nov 2026 12:00:45 GMT", now) == 45.0
    assert retry_after_s("soon") is None
    assert retry_after_s(None) is None
