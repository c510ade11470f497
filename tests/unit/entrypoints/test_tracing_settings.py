"""Tracing's configuration from the standard OpenTelemetry variables (entrypoints/tracing.py):
off by default, a clear error naming a variable this image cannot honour, and log lines that
carry the current span's IDs while tracing is on."""

from __future__ import annotations

import io
import json

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from entrypoints.logs import StructlogEventSink, configure_logging
from entrypoints.settings import SettingsError
from entrypoints.tracing import exporters, tracing_from


@pytest.mark.parametrize("environ", [
    {}, {"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_TRACES_EXPORTER": " "},
    {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"},
])
def test_tracing_is_off_unless_an_exporter_is_named(environ: dict[str, str]) -> None:
    assert exporters(environ) == []
    assert tracing_from("orders", environ) is None


def test_the_named_exporters_are_made() -> None:
    made = exporters({"OTEL_TRACES_EXPORTER": "otlp,console",
                      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    assert [type(e) for e in made] == [OTLPSpanExporter, ConsoleSpanExporter]


@pytest.mark.parametrize(("environ", "named"), [
    ({"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER='jaeger'"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
     "OTEL_EXPORTER_OTLP_PROTOCOL='grpc'"),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
      "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json'"),
])
def test_a_setting_this_image_cannot_honour_stops_start_up_naming_it(
        environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=f"invalid setting {named}"):
        tracing_from("orders", environ)


def test_log_lines_carry_the_current_spans_ids_while_tracing_is_on() -> None:
    stream = io.StringIO()
    configure_logging("INFO", stream)
    sink = StructlogEventSink()
    exporter = InMemorySpanExporter()
    tracing = tracing_from("orders", {}, exporter)
    assert tracing is not None
    try:
        with tracing.tracer.span("attempt"):
            sink.emit("handler.invoked", endpoint="orders")
        sink.emit("consumer.idle", endpoint="orders")  # outside any span
    finally:
        tracing.close()
    sink.emit("after.close", endpoint="orders")
    inside, outside, closed = (json.loads(line) for line in stream.getvalue().splitlines())
    [span] = exporter.get_finished_spans()
    assert inside["trace_id"] == format(span.context.trace_id, "032x")
    assert inside["span_id"] == format(span.context.span_id, "016x")
    assert "trace_id" not in outside
    assert "trace_id" not in closed
    assert span.resource.attributes["service.name"] == "orders"
