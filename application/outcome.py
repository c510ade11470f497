"""How a delivery ends: the one result type from the processing paths to the settlement (a
leaf module)."""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """How a delivery ended. The processing paths end a delivery as `PROCESSED` or
    `DUPLICATE` (or raise); settling it adds the other three. Every delivery ends as exactly
    one of these (an `UNSETTLED` one comes back as a new delivery)."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    RETRIED = "retried"
    DEAD_LETTERED = "dead_lettered"
    #: settling itself failed (connection lost): the broker redelivers the message
    UNSETTLED = "unsettled"
