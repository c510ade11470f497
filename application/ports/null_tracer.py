"""The tracer of a process whose tracing is off (`NULL_TRACER`): its spans record nothing, so
the protocol's steps trace unconditionally and need no "is tracing on" branch, except on
every message's hot path, where starting, entering and ending a span that records nothing,
and building its name and attributes, cost measurable work (docs/bench.md): `is
NULL_TRACER` skips a message's process span (`Processor`, `TokenBatch`), its attempt and
commit spans (`TransactionalPath`), the finish span and an output's publish span
(`Finisher`), and the trace context an output would carry (`Preparation`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from types import TracebackType

from application.ports.observability import Span, SpanKind, SpanValue, Tracer

#: reusable: a `nullcontext` holds no state between its `with` blocks
_NOT_CURRENT: AbstractContextManager[None] = nullcontext()


class NullSpan(AbstractContextManager["NullSpan"]):
    """A span that records nothing: `set` and `end` do nothing, `current` changes nothing.
    One instance serves every span (`NULL_SPAN`), and it is its own `with` block."""

    __slots__ = ()

    def set(self, name: str, value: SpanValue) -> None:
        """Nothing: no attribute is kept."""

    def current(self) -> AbstractContextManager[None]:
        """A block that makes nothing current."""
        return _NOT_CURRENT

    def end(self, error: BaseException | None = None) -> None:
        """Nothing: the span was never recorded."""

    def __enter__(self) -> NullSpan:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        return None


NULL_SPAN = NullSpan()


class NullTracer(Tracer):
    """A `Tracer` whose spans are `NULL_SPAN` and whose trace context is empty: the default
    wherever a tracer is taken (`Ports.tracer`, the protocol's collaborators)."""

    __slots__ = ()

    def start(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
              attributes: Mapping[str, SpanValue] | None = None,
              parent: Mapping[str, str] | None = None,
              links: Sequence[Mapping[str, str]] = ()) -> Span:
        """`NULL_SPAN`, whatever is asked."""
        return NULL_SPAN

    def span(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
             attributes: Mapping[str, SpanValue] | None = None,
             parent: Mapping[str, str] | None = None,
             links: Sequence[Mapping[str, str]] = ()) -> AbstractContextManager[Span]:
        """`NULL_SPAN` as a `with` block that does nothing."""
        return NULL_SPAN

    def headers(self) -> dict[str, str]:
        """No trace context: an empty dict (a new one each call: callers may fill it)."""
        return {}


NULL_TRACER = NullTracer()
