"""A one-endpoint service calling a third-party API (protocol 12), for the framework's
process tests: `shipping` (tests/support/shipping.py) books shipments with `carrier`.
`EO_SERVICE` = `SPEC` runs it; `EO_APIS__CARRIER__URL` names the provider."""

from __future__ import annotations

from datetime import timedelta

from application.registry import Registration, Registry, ThirdPartyApi
from tests.support.shipping import SHIPPING

REGISTRY = Registry(
    service="shipping",
    endpoints=(Registration(SHIPPING, apis=("carrier",)),),
    apis=(ThirdPartyApi("carrier", key_retention=timedelta(hours=24), timeout_s=5.0,
                        tries=8),),
)
SPEC = "tests.support.shipping_service:REGISTRY"
