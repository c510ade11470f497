"""What `eo chaos` feeds a service: messages as outside producers send them, from a JSON-lines
file or from a generator the service declares, and the service's optional domain check.

One message is one line of `eo embedded`'s input format (entrypoints/run_embedded.py)::

    {"queue": "parcels", "message_id": "<uuid>", "type": "Ship", "body": {...}, "headers": {}}

A service declares a generated workload as a module attribute that `--workload module:name`
names: an object with `draw(rng, size)` (the messages of one run, drawn from `rng`: the
campaign's seed replays them) and, optionally, `shuffle` (bool: whether the campaign may
publish them in any order; default True), `order_independent` (bool: the final states do
not depend on the order the messages are taken in, so the campaign compares every
endpoint's states with the fault-free run's; default False: the domain check judges them),
`seed_states(messages)` (endpoint -> partition -> state written before a run of those
messages, e.g. accounts opened) and `check(outcome)` (the domain's verdict on a run's final
states: a list of violations). A file workload (`--messages FILE`) publishes the whole file
each run; `--check module:function` adds a domain check to it, `--order-independent`
declares its outcome independent of the order.
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


class WorkloadError(ValueError):
    """A workload that cannot be used: the message names the file and line, or the spec."""


@dataclass(frozen=True)
class OutsideMessage:
    """One message as an outside producer publishes it: the queue (the routing key on the
    default exchange), the message ID (the same for every copy), the type name, the raw
    body and optional headers."""

    queue: str
    message_id: str
    type: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    def line(self) -> str:
        """The message as a line of `eo embedded`'s input format."""
        try:
            body: Any = json.loads(self.body)
        except ValueError:
            body = self.body.decode(errors="replace")
        return json.dumps({"queue": self.queue, "message_id": self.message_id,
                           "type": self.type, "body": body, "headers": dict(self.headers)})


def parse_line(line: str, where: str = "") -> OutsideMessage:
    """One JSON line as an `OutsideMessage`; raises WorkloadError naming `where` (e.g.
    "messages.jsonl:3") when it is not a JSON object with a queue, a message ID and a type
    (a message the service itself should refuse belongs in the workload with its own ID
    and type: the campaign checks it is dead-lettered as the fault-free run dead-letters
    it)."""
    try:
        raw = json.loads(line)
    except ValueError as exc:
        raise WorkloadError(f"{where}: not JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise WorkloadError(f"{where}: not a JSON object")
    missing = [k for k in ("queue", "message_id", "type") if not raw.get(k)]
    if missing:
        raise WorkloadError(f"{where}: no {', '.join(missing)}")
    body = raw.get("body", {})
    data = body.encode() if isinstance(body, str) else json.dumps(
        body, separators=(",", ":")).encode()
    headers = {str(k): str(v) for k, v in dict(raw.get("headers") or {}).items()}
    return OutsideMessage(str(raw["queue"]), str(raw["message_id"]), str(raw["type"]), data,
                          headers)


def read_messages(path: Path) -> list[OutsideMessage]:
    """The messages of JSON-lines file `path` (blank lines skipped). Raises WorkloadError
    naming the file, or its line, when it cannot be read or a line is no message."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise WorkloadError(f"{path}: {exc.strerror or exc}") from exc
    messages = [parse_line(line, f"{path}:{number}")
                for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not messages:
        raise WorkloadError(f"{path}: no message")
    return messages


@dataclass(frozen=True)
class RunOutcome:
    """What a run left, for a domain check: the final states per endpoint and partition
    (the domain's objects), the bucket's keys, and per third-party API the executions per
    idempotency key at its provider."""

    states: Mapping[str, Mapping[str, Any]]
    blobs: Sequence[str]
    api_executions: Mapping[str, Mapping[str, int]]
    messages: Sequence[OutsideMessage]


@runtime_checkable
class Workload(Protocol):
    """A generated workload (see the module docstring)."""

    def draw(self, rng: random.Random, size: int) -> list[OutsideMessage]:
        """The messages of one run (`size`: the workload's own unit, e.g. orders)."""
        ...  # pragma: no cover - a protocol


Check = Callable[[RunOutcome], list[str]]


@dataclass(frozen=True)
class FileWorkload:
    """Every message of a file, each run; `check` the domain's (optional)."""

    messages: tuple[OutsideMessage, ...]
    domain_check: Check | None = None
    shuffle: bool = True
    order_independent: bool = False

    def draw(self, rng: random.Random, size: int) -> list[OutsideMessage]:
        return list(self.messages)

    def check(self, outcome: RunOutcome) -> list[str]:
        return self.domain_check(outcome) if self.domain_check else []


def load_attribute(spec: str, option: str) -> Any:
    """The attribute `module:name` names; raises WorkloadError naming `option` when it
    cannot be imported or is missing."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise WorkloadError(f"{option} {spec!r}: expected module:attribute")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkloadError(f"{option} {spec!r}: cannot import {module_name} ({exc})") from exc
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        raise WorkloadError(f"{option} {spec!r}: {module_name} has no {attribute}") from exc


def load_workload(messages: Path | None, workload: str | None, check: str | None,
                  order_independent: bool = False) -> Workload:
    """The workload of `eo chaos`'s options: `--messages FILE` or `--workload module:name`
    (exactly one), and `--check module:function` and `--order-independent` with a file.
    Raises WorkloadError naming the option."""
    if (messages is None) == (workload is None):
        raise WorkloadError("give --messages FILE (JSON lines) or --workload module:name "
                            "(a generator the service declares)")
    if workload is not None:
        if check is not None:
            raise WorkloadError("--check goes with --messages: a declared workload has its "
                                "own check")
        if order_independent:
            raise WorkloadError("--order-independent goes with --messages: a declared "
                                "workload says it itself (order_independent)")
        found = load_attribute(workload, "--workload")
        if not isinstance(found, Workload):
            raise WorkloadError(f"--workload {workload!r}: no draw(rng, size) method")
        return found
    assert messages is not None
    domain_check = load_attribute(check, "--check") if check is not None else None
    if domain_check is not None and not callable(domain_check):
        raise WorkloadError(f"--check {check!r}: not a function")
    return FileWorkload(tuple(read_messages(messages)), domain_check,
                        order_independent=order_independent)
