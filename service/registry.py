"""The service's endpoints: the one module to edit when you add one.

Write the endpoint's pure definition in a package of your own under `domain/` (messages,
state, a deterministic handler: see `domain/decisions.py`), then add one `Registration` to
`ENDPOINTS` below: its role (`Role.CONSUMER` by default, `Role.GATEWAY` for messages from
outside producers, `Role.CALLEE` for an HTTP callee), a default strategy when `token` (or
`outbox` for a gateway) is not it, and what it uses (`blobs=True`, `callees=("name", ...)`,
`apis=("name", ...)`: third-party APIs, each declared once in `APIS` with its key retention).
The framework derives the rest: queues, stores, settings validation, `eo consume`, `eo serve`,
`eo embedded`, `eo endpoints`, `eo inspect`; `./dev manifests` writes the endpoints'
Kubernetes objects (deploy/k8s).
"""

from application.registry import Registration, Registry, ThirdPartyApi
#% if keep_sample
from service.sample import SAMPLE, SAMPLE_APIS  # the sample: drop this line, `*SAMPLE,` and
# `*SAMPLE_APIS,` below

#% else
#% filter replace("#!", "")
#!
#% endfilter
#% endif
ENDPOINTS: tuple[Registration, ...] = (
#% if keep_sample
    *SAMPLE,
#% endif
    # your endpoints, e.g. Registration(SHIPPING, blobs=True, callees=("billing",),
    #                                   apis=("carrier",)),
)
#: The third-party APIs your endpoints call (protocol 12), e.g.
#: ThirdPartyApi("carrier", key_retention=timedelta(hours=24)), with EO_APIS__CARRIER__URL
APIS: tuple[ThirdPartyApi, ...] = (
#% if keep_sample
    *SAMPLE_APIS,
#% endif
)

#% if false
REGISTRY = Registry(service="exactly-once-template", endpoints=ENDPOINTS, apis=APIS)
#% endif
#% filter replace("#! ", "")
#! REGISTRY = Registry(service="{{ service_name }}", endpoints=ENDPOINTS, apis=APIS)
#% endfilter
