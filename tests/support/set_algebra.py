"""A set-algebra endpoint for the state strategy's tests: Add(x) / Remove(x) on a set per
partition; every message reports the set after it (with the time and attempt it saw) to
`audit`, so a re-evaluated duplicate shows what state and context it was given."""

from __future__ import annotations

from dataclasses import dataclass

from domain.context import Context
from domain.decisions import Decision, Endpoint, Outgoing
from domain.errors import Rejected


@dataclass(frozen=True)
class AddMember:
    """Add `member` to `partition`'s set (`forbidden` is rejected)."""

    partition: str
    member: str


@dataclass(frozen=True)
class RemoveMember:
    """Remove `member` from `partition`'s set."""

    partition: str
    member: str


@dataclass(frozen=True)
class Changed:
    """What `audit` receives: the set after `incoming`, and the time and attempt it saw."""

    partition: str
    incoming: str
    members: tuple[str, ...]
    seen_at: str
    attempt: str


@dataclass(frozen=True)
class Members:
    """A partition's set, sorted."""

    members: tuple[str, ...] = ()


def handle(state: Members | None, message: object, context: Context) -> Decision[Members]:
    """Apply the change and report the set after it to `audit`."""
    state = state or Members()
    if isinstance(message, AddMember):
        if message.member == "forbidden":
            raise Rejected("forbidden member")
        members = tuple(sorted({*state.members, message.member}))
    elif isinstance(message, RemoveMember):
        members = tuple(m for m in state.members if m != message.member)
    else:
        raise Rejected(f"unknown {type(message).__name__}")
    out = Changed(message.partition, str(context.message_id), members,
                  context.now.isoformat(), str(context.attempt_id))
    return Decision(state=Members(members), outgoing=(Outgoing("audit", out),))


SET_ALGEBRA: Endpoint[Members] = Endpoint(
    name="sets",
    messages={"AddMember": AddMember, "RemoveMember": RemoveMember},
    partition_of=lambda m: m.partition,
    handle=handle,
    state_type=Members,
    outputs=("audit",),
)
