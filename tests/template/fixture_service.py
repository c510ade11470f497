"""The template test's fixture endpoints (`fixture/parcels`) as a service of the template's
checkout, with the messages its campaigns send: what a user adds to a new service, run here
on the framework as it is, without making a service from the template (copier, a new
environment). `EO_SERVICE=tests.template.fixture_service:REGISTRY` names it."""

from __future__ import annotations

import json
import uuid

from application.registry import Registration, Registry, Role
from tests.template.fixture.parcels import PARCELS, TRACKING

REGISTRY = Registry(service="parcel-service", endpoints=(
    Registration(PARCELS, role=Role.GATEWAY, blobs=True),
    Registration(TRACKING),
))
#: What `EO_SERVICE` names to run the fixture's endpoints in processes.
SPEC = "tests.template.fixture_service:REGISTRY"


def ship(parcel: str, grams: int, message_id: str, destination: str = "lyon") -> str:
    """An outside producer's `Ship` command to `parcels`, as a JSON line of `eo embedded`
    and `eo chaos --messages`."""
    return json.dumps({"queue": "parcels", "message_id": message_id, "type": "Ship",
                       "body": {"parcel": parcel, "grams": grams, "destination": destination}})


def campaign_lines() -> list[str]:
    """A campaign's workload: 16 parcels to two destinations (tracking gets two messages of
    one partition: its fence scenarios), a producer's retry of one, and one the service
    refuses."""
    lines = [ship(f"p-{n}", 100 + n, str(uuid.uuid4()), ("lyon", "paris")[n % 2])
             for n in range(16)]
    return [*lines, lines[3], ship("p-x", -1, str(uuid.uuid4()))]
