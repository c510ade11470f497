"""How an endpoint recognises duplicates: the three strategies (a leaf module)."""

from __future__ import annotations

import enum


class Strategy(enum.StrEnum):
    """An endpoint's deduplication strategy (configuration, per endpoint).

    - `TOKEN` (protocol 3): a message may be processed only while its token exists;
    - `OUTBOX` (protocol 4): positive proof, one processed-message row per message, the
      outgoing messages stored in it (the boundary's strategy: outside producers create no
      tokens);
    - `STATE`: an event-sourced state stream; outputs re-derived (application/state_path.py).
    """

    TOKEN = "token"
    OUTBOX = "outbox"
    STATE = "state"


#: Strategies whose receivers drop copies by message ID alone (no token needed): a sender
#: that creates no token (a `state` endpoint) may send only to these.
DEDUPLICATE_BY_ID = frozenset({Strategy.OUTBOX, Strategy.STATE})
