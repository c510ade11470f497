"""The handler's window on the world: everything impure arrives here as plain values."""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class HttpResponse:
    """The answer an HTTP follow-up's handler gets: a callee's stored business response, or a
    third-party API's status and JSON body."""

    status: int
    body: Mapping[str, Any]


@dataclass(frozen=True)
class Context:
    """Per-attempt facts a pure handler may use.

    - `message_id`: the incoming message's ID.
    - `attempt_id`: unique to this execution of the handler (protocol 2, "attempt").
    - `now`: the time the attempt started, UTC, from the processor's clock.
    - `http_response`: set only when handling an HTTP follow-up: a callee's stored response
      (protocol 6, step 3), or a third-party API's answer, 2xx or a 4xx business answer
      (protocol 12).
    """

    message_id: uuid.UUID
    attempt_id: uuid.UUID
    now: datetime
    http_response: HttpResponse | None = None

    def artifact_key(self, prefix: str, index: int = 0) -> str:
        """A name unique to this attempt for the `index`-th artifact under `prefix`.

        Returns `"<prefix>/<uuid>"` where the UUID is `uuid5(attempt_id, "<prefix>/<index>")`:
        as unique as the attempt ID (a uuid4), yet reproducible from the context, so the
        handler stays deterministic (protocol 3.2 step 2 and 5).
        """
        return f"{prefix}/{uuid.uuid5(self.attempt_id, f'{prefix}/{index}')}"


#: The name part of an artifact key: `artifact_key`'s uuid5, as text.
UUID5_TEXT = "[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
#: Any artifact key inside a text (a state's JSON), as group 1: a regular expression that
#: Python, Java (Spark) and PostgreSQL read alike.
ARTIFACT_KEY_IN_TEXT = f"([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/{UUID5_TEXT})"
_UUID = re.compile(f"^{UUID5_TEXT}$")


def is_artifact_key(key: str, prefixes: Collection[str]) -> bool:
    """Whether `key` is one `Context.artifact_key` makes under one of `prefixes`:
    `"<prefix>/<uuid5>"`. What a clean-up of a bucket may touch; any other object (a shared
    bucket's) is not the service's."""
    prefix, slash, rest = key.rpartition("/")
    return bool(slash) and prefix in prefixes and _UUID.match(rest) is not None
