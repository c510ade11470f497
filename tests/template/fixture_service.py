"""The template test's fixture endpoints (`fixture/parcels`) as a service of the template's
checkout, with the messages its campaigns send: what a user adds to a new service, run here
on the framework as it is, without making a service from the template (copier, a new
environment). `EO_SERVICE=tests.template.fixture_service:REGISTRY` names it."""

from __future__ import annotations

import json
import uuid

from application.registry import Registration, Registry, Role, ThirdPartyApi
from tests.template.fixture.parcels import PARCELS, TRACKING

REGISTRY = Registry(service="parcel-service", endpoints=(
    Registration(PARCELS, role=Role.GATEWAY, blobs=True),
    Registration(TRACKING, apis=("pickups",)),
), apis=(ThirdPartyApi("pickups"),))
#: What `EO_SERVICE` names to run the fixture's endpoints in processes.
SPEC = "tests.template.fixture_service:REGISTRY"


def ship(parcel: str, grams: int, message_id: str, destination: str = "lyon") -> str:
    """An outside producer's `Ship` command to `parcels`, as a JSON line of `eo embedded`
    and `eo chaos --messages`."""
    return json.dumps({"queue": "parcels", "message_id": message_id, "type": "Ship",
                       "body": {"parcel": parcel, "grams": grams, "destination": destination}})


def insure(parcel: str, value: int, message_id: str) -> str:
    """An outside producer's `Insure` command to `parcels`, as a JSON line."""
    return json.dumps({"queue": "parcels", "message_id": message_id, "type": "Insure",
                       "body": {"parcel": parcel, "value": value}})


def campaign_lines() -> list[str]:
    """A campaign's workload, what a team's would hold: 16 parcels to lyon and paris
    (tracking, fed only by parcels, gets two messages of one partition, and books a pickup
    for each: a follow-up), 3 to nice, which takes 2 (which one is refused depends on the
    order: a handler's rejection, its token kept by its dead letter), 2 parcels insured
    after they ship (parcels commits twice on their partition; insured before it ships, a
    parcel is refused: the order again), a producer's retry of one, one the service refuses
    (its weight) and one that is not JSON."""
    lines = [ship(f"p-{n}", 100 + n, str(uuid.uuid4()), ("lyon", "paris")[n % 2])
             for n in range(16)]
    lines += [ship(f"n-{n}", 300 + n, str(uuid.uuid4()), "nice") for n in range(3)]
    lines += [insure("p-1", 80, str(uuid.uuid4())), insure("p-2", 120, str(uuid.uuid4()))]
    malformed = json.dumps({"queue": "parcels", "message_id": str(uuid.uuid4()),
                            "type": "Ship", "body": "{still not json"})
    return [*lines, lines[3], ship("p-x", -1, str(uuid.uuid4())), malformed]
