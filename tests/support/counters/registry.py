"""The counters service's registry (the framework's tests run it, in and out of processes)."""

from __future__ import annotations

from application.registry import Registration, Registry, Role
from tests.support.counters.endpoints import AUDIT, BANK, COUNTER, FRONT

REGISTRY = Registry(service="counters", endpoints=(
    Registration(FRONT, role=Role.GATEWAY),
    Registration(COUNTER, blobs=True, callees=("bank",)),
    Registration(AUDIT),
    Registration(BANK, role=Role.CALLEE),
))
#: What `EO_SERVICE` names to run the counters in processes.
SPEC = "tests.support.counters.registry:REGISTRY"
