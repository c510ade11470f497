"""The sample's endpoints (TPC-H orders, `domain/sample`), registered in `service/registry.py`.
Dropping the sample removes this module and its two lines there."""

from application.registry import Registration, Role
from domain.sample.gateway import GATEWAY
from domain.sample.ledger import LEDGER
from domain.sample.orders import ORDERS
from domain.sample.payments import PAYMENTS

SAMPLE = (
    Registration(GATEWAY, role=Role.GATEWAY),
    Registration(ORDERS, blobs=True, callees=("payments",)),
    Registration(LEDGER),
    Registration(PAYMENTS, role=Role.CALLEE, request_type="PaymentRequest"),
)
