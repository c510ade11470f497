"""Tracing with OpenTelemetry: the `Tracer` port on an OpenTelemetry tracer provider, and the
instrumentation of the libraries the adapters call (asyncpg, httpx, aiobotocore; FastAPI per
application). entrypoints/tracing.py builds the provider from the standard `OTEL_*`
variables."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.botocore import AiobotocoreInstrumentor
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.trace import Link, Status, StatusCode

from application.envelope import TRACEPARENT_HEADER
from application.ports import SpanKind, SpanValue

_KINDS = {SpanKind.INTERNAL: trace.SpanKind.INTERNAL,
          SpanKind.CONSUMER: trace.SpanKind.CONSUMER,
          SpanKind.PRODUCER: trace.SpanKind.PRODUCER,
          SpanKind.CLIENT: trace.SpanKind.CLIENT}
#: the instrumentation scope of the protocol's spans
SCOPE = "eo"


class OtelSpan:
    """`Span` on an OpenTelemetry span."""

    __slots__ = ("otel",)

    def __init__(self, span: trace.Span) -> None:
        self.otel = span

    def set(self, name: str, value: SpanValue) -> None:
        self.otel.set_attribute(name, value)

    def current(self) -> AbstractContextManager[None]:
        return _current(self.otel)

    def end(self, error: BaseException | None = None) -> None:
        if error is not None:
            self.otel.record_exception(error)
            self.otel.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.otel.end()


@contextmanager
def _current(span: trace.Span) -> Iterator[None]:
    with trace.use_span(span, end_on_exit=False, record_exception=False,
                        set_status_on_exception=False):
        yield


def _context(headers: Mapping[str, str] | None) -> Any:
    """The OpenTelemetry context of a message's trace headers; None (the current context)
    when they carry none."""
    if not headers or TRACEPARENT_HEADER not in headers:
        return None
    return propagate.extract(headers)


class OtelTracer:
    """`Tracer` on OpenTelemetry `provider` (an SDK `TracerProvider`, or the API's), trace
    contexts in and out of headers by the global propagator (`OTEL_PROPAGATORS`; W3C trace
    context by default)."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self._tracer = provider.get_tracer(SCOPE)

    def start(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
              attributes: Mapping[str, SpanValue] | None = None,
              parent: Mapping[str, str] | None = None,
              links: Sequence[Mapping[str, str]] = ()) -> OtelSpan:
        linked = []
        for headers in links:
            context = _context(headers)
            if context is not None:
                linked_span = trace.get_current_span(context).get_span_context()
                if linked_span.is_valid:
                    linked.append(Link(linked_span))
        return OtelSpan(self._tracer.start_span(name, context=_context(parent),
                                                kind=_KINDS[kind], attributes=attributes,
                                                links=linked))

    @contextmanager
    def span(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
             attributes: Mapping[str, SpanValue] | None = None,
             parent: Mapping[str, str] | None = None,
             links: Sequence[Mapping[str, str]] = ()) -> Iterator[OtelSpan]:
        span = self.start(name, kind, attributes, parent, links)
        with span.current():
            try:
                yield span
            except BaseException as exc:
                span.end(exc)
                raise
        span.end()

    def headers(self) -> dict[str, str]:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        return carrier


#: the instrumentations of the libraries the adapters call (two of them untyped)
_LIBRARIES: tuple[Any, ...] = (AsyncPGInstrumentor, HTTPXClientInstrumentor,
                               AiobotocoreInstrumentor)


class Instrumentation:
    """The OpenTelemetry instrumentation of asyncpg, httpx and aiobotocore on `provider`,
    for this process (they patch the libraries' classes): `start()` once, `stop()` at the
    end. `app(fastapi_app)` instruments one FastAPI application (a callee's server)."""

    def __init__(self, provider: trace.TracerProvider) -> None:
        self._provider = provider
        self._libraries = tuple(make() for make in _LIBRARIES)

    def start(self) -> None:
        for instrumentor in self._libraries:
            if not instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.instrument(tracer_provider=self._provider)

    def stop(self) -> None:
        for instrumentor in self._libraries:
            if instrumentor.is_instrumented_by_opentelemetry:
                instrumentor.uninstrument()

    def app(self, app: Any) -> None:
        """Server spans for every request of FastAPI `app`, continuing the caller's trace
        context (the `traceparent` header httpx's instrumentation sends)."""
        FastAPIInstrumentor.instrument_app(app, tracer_provider=self._provider,
                                           exclude_spans=["receive", "send"])
