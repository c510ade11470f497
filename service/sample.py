"""The sample's endpoints (TPC-H orders, `domain/sample`), registered in `service/registry.py`.
Dropping the sample removes this module and its two lines there."""

from datetime import timedelta

from application.registry import Registration, Role, ThirdPartyApi
from domain.sample.gateway import GATEWAY
from domain.sample.ledger import LEDGER
from domain.sample.orders import ORDERS
from domain.sample.payments import PAYMENTS

SAMPLE = (
    Registration(GATEWAY, role=Role.GATEWAY),
    Registration(ORDERS, blobs=True, callees=("payments",), apis=("carrier",),
                 blob_prefixes=("invoices",), blob_fields=("invoice_key",)),
    Registration(LEDGER),
    Registration(PAYMENTS, role=Role.CALLEE, request_type="PaymentRequest"),
)
#: The third-party APIs the sample calls: a carrier that books shipments, keeping its
#: idempotency keys a day (EO_APIS__CARRIER__URL; without it, an in-process sandbox)
SAMPLE_APIS = (ThirdPartyApi("carrier", key_retention=timedelta(hours=24)),)
