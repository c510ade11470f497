"""Tracing's configuration: OpenTelemetry from the standard `OTEL_*` variables, off unless
`OTEL_TRACES_EXPORTER` names an exporter (docs/operations.md, "Tracing").

- `OTEL_TRACES_EXPORTER`: `otlp` (OTLP over HTTP, protobuf), `console` (spans as JSON on
  stdout), both comma-separated, or `none`; unset: tracing is off.
- `OTEL_SDK_DISABLED=true`: off, whatever the exporter.
- The exporter's own: `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`,
  `..._HEADERS`, `..._TIMEOUT`, `..._COMPRESSION`; `OTEL_EXPORTER_OTLP_PROTOCOL` must be
  `http/protobuf` (the gRPC exporter is not installed).
- `OTEL_SERVICE_NAME` (default: the process's endpoint), `OTEL_RESOURCE_ATTRIBUTES`,
  `OTEL_TRACES_SAMPLER` / `_ARG`, `OTEL_BSP_*` (the batch span processor), `OTEL_PROPAGATORS`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)

from adapters.tracing import Instrumentation, OtelTracer
from entrypoints.logs import log_trace_ids
from entrypoints.settings import SettingsError

#: the exporters `OTEL_TRACES_EXPORTER` may name
EXPORTERS = ("otlp", "console", "none")
_OTLP_PROTOCOL = "http/protobuf"


class Tracing:
    """A process's tracing: the `tracer` the endpoints' steps use, its `provider` and the
    libraries' `instrumentation`. `close()` exports what is left and removes the
    instrumentation."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = OtelTracer(provider)
        self.instrumentation = Instrumentation(provider)

    def start(self) -> None:
        """Instrument the libraries and put trace IDs in log lines."""
        self.instrumentation.start()
        log_trace_ids(True)

    def close(self) -> None:
        """Flush the spans still queued (the exporter's timeout at most), then stop."""
        log_trace_ids(False)
        self.instrumentation.stop()
        self.provider.shutdown()


def exporters(environ: Mapping[str, str]) -> list[SpanExporter]:
    """The span exporters `environ` asks for (empty: tracing is off). Raises
    `SettingsError` naming the variable for an exporter or protocol this image lacks."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get("OTEL_TRACES_EXPORTER", "none")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise SettingsError(f"invalid setting OTEL_TRACES_EXPORTER={raw!r}: "
                            f"{', '.join(unknown)} is not one of {', '.join(EXPORTERS)}")
    made: list[SpanExporter] = []
    if "otlp" in names:
        for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            protocol = environ.get(variable)
            if protocol is not None and protocol.strip() != _OTLP_PROTOCOL:
                raise SettingsError(f"invalid setting {variable}={protocol!r}: only "
                                    f"{_OTLP_PROTOCOL} is supported")
            if protocol is not None:
                break
        made.append(OTLPSpanExporter())
    if "console" in names:
        made.append(ConsoleSpanExporter())
    return made


def tracing_from(service_name: str, environ: Mapping[str, str] | None = None,
                 exporter: SpanExporter | None = None) -> Tracing | None:
    """The process's tracing, or None when it is off (see the module docstring).
    `service_name`: `service.name` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES`
    names one. `exporter`: export to it, synchronously, instead (tests: an in-memory
    exporter). Raises `SettingsError` as `exporters`."""
    environ = os.environ if environ is None else environ
    chosen = [exporter] if exporter is not None else exporters(environ)
    if not chosen:
        return None
    named = "OTEL_SERVICE_NAME" in environ or "service.name=" in environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", "")
    resource = Resource.create({} if named else {SERVICE_NAME: service_name})
    provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    for made in chosen:
        provider.add_span_processor(SimpleSpanProcessor(made) if exporter is not None
                                    else BatchSpanProcessor(made))
    tracing = Tracing(provider)
    tracing.start()
    return tracing


def tracing_resource(service_name: str) -> Iterator[Tracing | None]:
    """`tracing_from(service_name)` as a dependency-injector resource: closed (spans
    flushed) when the container's resources shut down."""
    tracing = tracing_from(service_name)
    try:
        yield tracing
    finally:
        if tracing is not None:
            tracing.close()
