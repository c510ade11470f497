"""An OTLP/HTTP trace receiver for tests: what an OpenTelemetry collector would receive from
the service's processes (`OTEL_TRACES_EXPORTER=otlp`), decoded and kept in memory.

    with otlp_receiver() as receiver:          # 127.0.0.1, a free port
        env = receiver.env("orders")            # the process's OTEL_* settings
        ...
        spans = receiver.spans                  # every span received so far
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tools.bench.otlp_sink import otlp_server


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as received: IDs in hex (parent "" for a root), the exporting process's
    `service.name`, its name, kind (OTLP's number) and attributes."""

    trace_id: str
    span_id: str
    parent_id: str
    service: str
    name: str
    kind: int
    attributes: dict[str, Any]
    links: tuple[str, ...]  # the linked spans' trace IDs


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


@dataclass
class OtlpReceiver:
    """The spans received (`spans`) at `url` + `/v1/traces` (set once it serves)."""

    url: str
    spans: list[ReceivedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def env(self, service_name: str) -> dict[str, str]:
        """A process's settings to export its spans here, at once (no batching delay)."""
        return {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": self.url,
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                "OTEL_SERVICE_NAME": service_name, "OTEL_BSP_SCHEDULE_DELAY": "100"}

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def keep(self, request: ExportTraceServiceRequest) -> None:
        """Keep the spans of one export request."""
        found = []
        for resource_spans in request.resource_spans:
            service = next((_value(a.value) for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    found.append(ReceivedSpan(
                        span.trace_id.hex(), span.span_id.hex(), span.parent_span_id.hex(),
                        str(service), span.name, span.kind,
                        {a.key: _value(a.value) for a in span.attributes},
                        tuple(link.trace_id.hex() for link in span.links)))
        with self.lock:
            self.spans.extend(found)


@contextlib.contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """A receiver on 127.0.0.1 and a free port (`tools.bench.otlp_sink.otlp_server`),
    served from a thread until exit."""
    receiver = OtlpReceiver("")
    with otlp_server(receiver.keep) as url:
        receiver.url = url
        yield receiver
